package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/smtp"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/loadgen"
)

// startSink runs the sink on 127.0.0.1:0 with the extra args and returns
// its address and a function that stops it and checks that it drained
// cleanly; the test's cleanup calls that function too (it is idempotent).
func startSink(t *testing.T, args ...string) (addr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	args = append([]string{"--addr", "127.0.0.1:0", "--domain", "example.test", "--print-listeners"}, args...)
	go func() {
		err := run(ctx, args, pw, io.Discard)
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
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sink did not stop cleanly: %v", err)
		}
	})
	t.Cleanup(stop)
	return addrs["smtp"], stop
}

func TestSinkAcceptsLocalAndDiscards(t *testing.T) {
	addr, _ := startSink(t)
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
	addr, _ := startSink(t)
	err := smtp.SendMail(addr, nil, "a@example.test", []string{"someone@elsewhere.test"}, []byte("Subject: x\r\n\r\nx\r\n"))
	if err == nil || !strings.Contains(err.Error(), "55") {
		t.Fatalf("relay to a foreign domain: %v, want a 55x refusal", err)
	}
	if err := smtp.SendMail(addr, nil, "a@example.test", []string{"anyone@EXAMPLE.test"}, []byte("Subject: x\r\n\r\nx\r\n")); err != nil {
		t.Fatalf("local recipient: %v", err)
	}
}

// TestDurableSinkLogsEveryAcknowledgedMessage checks the contract of
// --durable: after a concurrent load and a clean stop, the log holds one
// intact record per acknowledged message, each the message as sent.
func TestDurableSinkLogsEveryAcknowledgedMessage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log") // created by the sink
	addr, stop := startSink(t, "--durable", dir)
	users := loadgen.UserNames("example.test", 50)
	z, err := loadgen.NewZipf(users, 1)
	if err != nil {
		t.Fatal(err)
	}
	var ledger loadgen.Ledger
	const n = 200
	sum, err := loadgen.Run(t.Context(), loadgen.Config{
		Addr: addr,
		Spec: loadgen.Spec{Seed: 2, RunID: "durable", From: "l@quill-load.invalid",
			Sizes: loadgen.UniformSize{Min: 100, Max: 300_000}, Rcpts: z},
		Concurrency: 8,
		Count:       n,
		Timeout:     10 * time.Second,
		OnRecord:    ledger.Add,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if sum.Acked != n {
		t.Fatalf("durable sink acked %d of %d: %+v", sum.Acked, n, sum)
	}

	byID := map[string]*loadgen.Record{}
	for _, r := range ledger.Records() {
		if r.Outcome == loadgen.Acked {
			byID[r.ID] = r
		}
	}
	bodies := readLog(t, filepath.Join(dir, logName))
	if len(bodies) != len(byID) {
		t.Fatalf("log holds %d records, %d messages were acknowledged", len(bodies), len(byID))
	}
	seen := map[string]bool{}
	for i, b := range bodies {
		msg := loadgen.StripTrace(b)
		id, ok := loadgen.HeaderValue(msg, loadgen.IDHeader)
		r := byID[id]
		switch {
		case !ok || r == nil:
			t.Errorf("record %d: no acknowledged message with id %q", i, id)
		case seen[id]:
			t.Errorf("record %d: %s logged twice", i, id)
		case sha256.Sum256(msg) != r.Sum:
			t.Errorf("record %d: %s differs from what was sent (%d octets logged, %d sent)", i, id, len(msg), r.Size)
		}
		seen[id] = true
	}
}

// readLog returns the bodies of the records of the log at path, failing
// the test on a bad checksum or trailing octets. It parses the format on
// its own rather than with the code under test.
func readLog(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var bodies [][]byte
	for off := 0; off < len(b); {
		if len(b)-off < 8 {
			t.Fatalf("%s: %d trailing octets at %d", path, len(b)-off, off)
		}
		n := int(binary.LittleEndian.Uint32(b[off:]))
		sum := binary.LittleEndian.Uint32(b[off+4:])
		off += 8
		if n > len(b)-off {
			t.Fatalf("%s: record at %d claims %d octets, %d left", path, off-8, n, len(b)-off)
		}
		body := b[off : off+n]
		if got := crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)); got != sum {
			t.Fatalf("%s: record at %d: crc32c %08x, header says %08x", path, off-8, got, sum)
		}
		bodies = append(bodies, body)
		off += n
	}
	return bodies
}
