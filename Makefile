# make check runs exactly what CI runs (scripts/test).
.PHONY: build run check test

build:
	go build -o quill ./cmd/quill
	go build -o quill-load ./cmd/quill-load

run: build
	./quill serve

check:
	scripts/test

# test is the quick inner loop: no installs, no fuzzing.
test:
	go vet ./...
	go test -race ./...
