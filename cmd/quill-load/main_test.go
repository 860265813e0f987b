package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"imap"},
		{"smtp"},
		{"smtp", "--addr", "127.0.0.1:1"},
		{"smtp", "--addr", "127.0.0.1:1", "--rcpt-domain", "d.test"}, // neither --count nor --duration
		{"smtp", "--addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--count", "1", "--users", "0"},
		{"smtp", "--addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--count", "1", "extra"},
		{"smtp", "--bogus"},
		{"smtp", "--addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--count", "1", "--messages-per-conn", "-1"},
		{"mix", "--smtp-addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--messages-per-conn", "-1"},
		{"mix"},
		{"mix", "--smtp-addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--sizes", "gaussian"},
		{"mix", "--smtp-addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--pop3-share", "2"},
		{"mix", "--smtp-addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--pid", "quill"},
		{"mix", "--smtp-addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--retrieval", "smtp"},
		{"saturate", "--smtp-addr", "127.0.0.1:1", "--rcpt-domain", "d.test", "--retrieval", "IMAP4"},
		{"saturate", "--smtp-addr", "127.0.0.1:1"},
	} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), args, &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// sink is a lock-step SMTP server that accepts everything and counts
// messages; it stops when the test ends.
func sink(t *testing.T) (addr string, count func() int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	var wg sync.WaitGroup
	conns := map[net.Conn]bool{}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				r, w := bufio.NewReader(c), bufio.NewWriter(c)
				say := func(s string) { w.WriteString(s + "\r\n"); w.Flush() }
				say("220 sink")
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					switch verb, _, _ := strings.Cut(strings.TrimSpace(line), " "); strings.ToUpper(verb) {
					case "DATA":
						say("354 go")
						for line != ".\r\n" {
							if line, err = r.ReadString('\n'); err != nil {
								return
							}
						}
						mu.Lock()
						n++
						mu.Unlock()
						say("250 ok")
					case "QUIT":
						say("221 bye")
						return
					default:
						say("250 ok")
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func TestSMTPRunJSON(t *testing.T) {
	addr, count := sink(t)
	var out, errb bytes.Buffer
	args := []string{"smtp", "--addr", addr, "--rcpt-domain", "example.test", "--users", "3",
		"--concurrency", "2", "--count", "25", "--size", "1000", "--seed", "7", "--json"}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got struct {
		Seed     uint64 `json:"seed"`
		Acked    int64  `json:"acked"`
		Attempts int64  `json:"attempted"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got.Seed != 7 || got.Acked != 25 || got.Attempts != 25 || count() != 25 {
		t.Fatalf("summary %+v, sink saw %d\n%s", got, count(), out.String())
	}
}

// TestSMTPRunOnePerConn: --messages-per-conn 1 opens a connection for
// every message, and the summary says so.
func TestSMTPRunOnePerConn(t *testing.T) {
	addr, count := sink(t)
	var out, errb bytes.Buffer
	args := []string{"smtp", "--addr", addr, "--rcpt-domain", "example.test", "--users", "3",
		"--concurrency", "2", "--count", "12", "--messages-per-conn", "1", "--json"}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got struct {
		Acked       int64 `json:"acked"`
		Connections int64 `json:"connections"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got.Acked != 12 || got.Connections != 12 || count() != 12 {
		t.Fatalf("summary %+v, sink saw %d\n%s", got, count(), out.String())
	}
}

func TestSMTPRunTable(t *testing.T) {
	addr, _ := sink(t)
	var out, errb bytes.Buffer
	args := []string{"smtp", "--addr", addr, "--rcpt-domain", "example.test", "--count", "5", "--concurrency", "1"}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{`(?m)^acked +5$`, `(?m)^acked msg/s +[0-9.]+$`, `(?m)^latency p99 +\S+$`} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestMixCPUProfile: --cpuprofile leaves a gzip'd pprof profile of the
// generator behind once the run is over.
func TestMixCPUProfile(t *testing.T) {
	addr, count := sink(t)
	prof := filepath.Join(t.TempDir(), "gen.prof")
	var out, errb bytes.Buffer
	args := []string{"mix", "--smtp-addr", addr, "--rcpt-domain", "example.test", "--users", "3",
		"--pop3-share", "0", "--probes", "0", "--sample", "0", "--clients", "2", "--duration", "300ms", "--cpuprofile", prof}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	b, err := os.ReadFile(prof)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("profile is not gzip'd pprof data: % x", b[:min(len(b), 8)])
	}
	if count() == 0 {
		t.Error("no message reached the sink")
	}
}

// TestSaturateRefines: after the climb fails, --refine runs narrowing steps
// between the highest pass and the lowest failure.
func TestSaturateRefines(t *testing.T) {
	addr, _ := sink(t)
	var out, errb bytes.Buffer
	// One client in lock step cannot start 1,000,000 transactions a second.
	args := []string{"saturate", "--smtp-addr", addr, "--rcpt-domain", "example.test", "--users", "3",
		"--pop3-share", "0", "--probes", "0", "--sample", "0", "--clients", "1", "--duration", "200ms",
		"--start-rate", "20", "--factor", "50000", "--max-steps", "3", "--refine", "2", "--retries", "0", "--latency-bound", "1s"}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	steps := regexp.MustCompile(`(?m)^offered +([0-9.]+) tx/s: .*: (pass|FAIL)$`).FindAllStringSubmatch(out.String(), -1)
	if len(steps) != 4 || steps[0][2] != "pass" || steps[1][2] != "FAIL" || steps[2][1] != "4472.1" {
		t.Errorf("want 20 (pass), 1000000 (fail), then 2 refinements from 4472.1:\n%s", out.String())
	}
	if !regexp.MustCompile(`(?m)^peak: [0-9.]+ tx/s offered`).MatchString(out.String()) {
		t.Errorf("no peak line:\n%s", out.String())
	}
}
