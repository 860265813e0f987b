// Package clusterpb is the generated code of the cluster's node-to-node RPC
// service (cluster.proto): protobuf messages and gRPC stubs. Nothing here
// is written by hand except this file; regenerate with `go generate` after
// changing cluster.proto (it needs protoc, protoc-gen-go v1.36.12 and
// protoc-gen-go-grpc v1.5.1 on PATH).
package clusterpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative cluster.proto
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative events.proto
