package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
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
