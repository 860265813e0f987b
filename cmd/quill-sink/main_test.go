package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/smtp"
	"strings"
	"testing"
	"time"

	"quill/internal/loadgen"
)

// startSink runs the sink on 127.0.0.1:0 and returns its address; the
// test's cleanup stops it and checks that it drained cleanly.
func startSink(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, []string{"--addr", "127.0.0.1:0", "--domain", "example.test", "--print-listeners"}, pw, io.Discard)
		pw.CloseWithError(io.EOF)
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("no listener line: %v (run: %v)", err, <-done)
	}
	go io.Copy(io.Discard, pr)
	var addrs map[string]string
	if err := json.Unmarshal([]byte(line), &addrs); err != nil || addrs["smtp"] == "" {
		t.Fatalf("listener line %q: %v", line, err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sink did not stop cleanly: %v", err)
		}
	})
	return addrs["smtp"]
}

func TestSinkAcceptsLocalAndDiscards(t *testing.T) {
	addr := startSink(t)
	users := loadgen.UserNames("example.test", 50)
	z, err := loadgen.NewZipf(users, 1)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := loadgen.Run(t.Context(), loadgen.Config{
		Addr: addr,
		Spec: loadgen.Spec{Seed: 1, RunID: "sink", From: "l@quill-load.invalid",
			Sizes: loadgen.UniformSize{Min: 100, Max: 300_000}, Rcpts: z},
		Concurrency: 4,
		Count:       200,
		Timeout:     10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Acked != 200 {
		t.Fatalf("sink acked %d of 200: %+v", sum.Acked, sum)
	}
}

func TestSinkIsNoRelay(t *testing.T) {
	addr := startSink(t)
	err := smtp.SendMail(addr, nil, "a@example.test", []string{"someone@elsewhere.test"}, []byte("Subject: x\r\n\r\nx\r\n"))
	if err == nil || !strings.Contains(err.Error(), "55") {
		t.Fatalf("relay to a foreign domain: %v, want a 55x refusal", err)
	}
	if err := smtp.SendMail(addr, nil, "a@example.test", []string{"anyone@EXAMPLE.test"}, []byte("Subject: x\r\n\r\nx\r\n")); err != nil {
		t.Fatalf("local recipient: %v", err)
	}
}
