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
// its listeners' addresses by protocol and a function that stops it and checks that it drained
// cleanly; the test's cleanup calls that function too (it is idempotent).
func startSink(t *testing.T, args ...string) (addrs map[string]string, stop func()) {
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
	return addrs, stop
}

func TestSinkAcceptsLocalAndDiscards(t *testing.T) {
	addrs, _ := startSink(t)
	users := loadgen.UserNames("example.test", 50)
	z, err := loadgen.NewZipf(users, 1)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := loadgen.Run(t.Context(), loadgen.Config{
		Addr: addrs["smtp"],
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
	addrs, _ := startSink(t)
	addr := addrs["smtp"]
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
	addrs, stop := startSink(t, "--durable", dir)
	users := loadgen.UserNames("example.test", 50)
	z, err := loadgen.NewZipf(users, 1)
	if err != nil {
		t.Fatal(err)
	}
	var ledger loadgen.Ledger
	const n = 200
	sum, err := loadgen.Run(t.Context(), loadgen.Config{
		Addr: addrs["smtp"],
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
	recs := readLog(t, filepath.Join(dir, logName))
	if len(recs) != len(byID) {
		t.Fatalf("log holds %d records, %d messages were acknowledged", len(recs), len(byID))
	}
	seen := map[string]bool{}
	for i, rec := range recs {
		msg := loadgen.StripTrace(rec.body)
		id, ok := loadgen.HeaderValue(msg, loadgen.IDHeader)
		r := byID[id]
		switch {
		case !ok || r == nil:
			t.Errorf("record %d: no acknowledged message with id %q", i, id)
		case seen[id]:
			t.Errorf("record %d: %s logged twice", i, id)
		case sha256.Sum256(msg) != r.Sum:
			t.Errorf("record %d: %s differs from what was sent (%d octets logged, %d sent)", i, id, len(msg), r.Size)
		case rec.kind != 'M' || strings.Join(rec.users, ",") != strings.ToLower(strings.Join(r.Rcpts, ",")):
			t.Errorf("record %d: %s logged as kind %q for %q, sent to %q", i, id, rec.kind, rec.users, r.Rcpts)
		}
		seen[id] = true
	}
}

// logRecord is one record of the durable log as readLog decodes it.
type logRecord struct {
	off   int64
	kind  byte
	users []string // 'M': the recipients; 'X': the one user
	body  []byte   // 'M': the message
	recs  []int64  // 'X': the messages expunged
}

// readLog returns the records of the log at path, failing the test on a
// bad checksum, a malformed payload or trailing octets. It parses the
// format on its own rather than with the code under test.
func readLog(t *testing.T, path string) []logRecord {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []logRecord
	for off := 0; off < len(b); {
		if len(b)-off < 8 {
			t.Fatalf("%s: %d trailing octets at %d", path, len(b)-off, off)
		}
		n := int(binary.LittleEndian.Uint32(b[off:]))
		sum := binary.LittleEndian.Uint32(b[off+4:])
		if n > len(b)-off-8 {
			t.Fatalf("%s: record at %d claims %d octets, %d left", path, off, n, len(b)-off-8)
		}
		p := b[off+8 : off+8+n]
		if got := crc32.Checksum(p, crc32.MakeTable(crc32.Castagnoli)); got != sum {
			t.Fatalf("%s: record at %d: crc32c %08x, header says %08x", path, off, got, sum)
		}
		r := logRecord{off: int64(off), kind: p[0]}
		p = p[1:]
		num := func() int {
			v, k := binary.Uvarint(p)
			if k <= 0 {
				t.Fatalf("%s: record at %d: bad uvarint", path, off)
			}
			p = p[k:]
			return int(v)
		}
		str := func() string {
			k := num()
			s := string(p[:k])
			p = p[k:]
			return s
		}
		switch r.kind {
		case 'M':
			for range num() {
				r.users = append(r.users, str())
			}
			r.body = p
		case 'X':
			r.users = []string{str()}
			for range num() {
				r.recs = append(r.recs, int64(num()))
			}
			if len(p) != 0 {
				t.Fatalf("%s: record at %d: %d trailing octets", path, off, len(p))
			}
		default:
			t.Fatalf("%s: record at %d: kind %q", path, off, r.kind)
		}
		recs = append(recs, r)
		off += 8 + n
	}
	return recs
}

// TestFlagsThatNeedDurable: the modes built on the log refuse to start
// without one, rather than run as the plain sink.
func TestFlagsThatNeedDurable(t *testing.T) {
	for _, args := range [][]string{
		{"--no-sync"},
		{"--pop3-addr", "127.0.0.1:0", "--password", "pw"},
		{"--pop3-addr", "127.0.0.1:0", "--durable", t.TempDir()},
	} {
		err := run(t.Context(), append([]string{"--addr", "127.0.0.1:0"}, args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "needs --") {
			t.Errorf("%q: %v, want a refusal", args, err)
		}
	}
}
