package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"
)

// heldMemory returns the live heap after a collection plus the goroutine
// stacks in use: what the process keeps for its connections.
func heldMemory() uint64 {
	// Twice: sync.Pool keeps what it held through one collection.
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() + s[1].Value.Uint64()
}

// session opens one session on addr and brings it to its idle state.
type session func(addr string) (net.Conn, error)

// dialExpect dials addr and returns the connection with a function that
// sends a line (if not empty) and reads until a line starting with ok,
// failing on one starting with bad.
func dialExpect(addr string) (net.Conn, func(send, ok, bad string) error, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	return c, func(send, ok, bad string) error {
		if send != "" {
			if _, err := io.WriteString(c, send+"\r\n"); err != nil {
				return err
			}
		}
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return err
			}
			switch {
			case strings.HasPrefix(line, ok):
				return nil
			case strings.HasPrefix(line, bad):
				return fmt.Errorf("%q: %s", send, line)
			}
		}
	}, nil
}

func steps(addr string, s [][3]string) (net.Conn, error) {
	c, x, err := dialExpect(addr)
	if err != nil {
		return nil, err
	}
	for _, st := range s {
		if err := x(st[0], st[1], st[2]); err != nil {
			return c, err
		}
	}
	return c, nil
}

// Memory per idle connection, measured over real TCP on the real server:
// 1,000 clients per protocol open a session (IMAP: logged in, INBOX
// selected; POP3: logged in; SMTP: after EHLO) and go quiet. IMAP and POP3
// hand their buffers back while idle (textconn.Options.ReleaseIdle): each
// such connection must cost at most 16 KiB, where IMAP held 90 KiB and
// POP3 23 KiB before. SMTP keeps its 4 KiB buffers (a BDAT body holds its
// reader across command lines; a session lasts at most command_timeout
// idle): 24 KiB. docs/configuration.md states the figures.
func TestIdleConnectionMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("measures memory; run without -race")
	}
	const n = 1000
	for _, p := range []struct {
		listener string
		steps    [][3]string
		bound    int64
	}{
		{"imap", [][3]string{{"", "* OK", "* BYE"}, {"a LOGIN alice@example.test password1", "a OK", "a "}, {"b SELECT INBOX", "b OK", "b "}}, 16 << 10},
		{"pop3", nil, 16 << 10},
		{"smtp", [][3]string{{"", "220 ", "4"}, {"EHLO client.example.test", "250 ", "5"}}, 24 << 10},
	} {
		t.Run(p.listener, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Listeners.IMAP = "127.0.0.1:0"
			cfg.Limits.MaxConnectionsPerIP = 2 * n
			addUser(t, cfg, "alice@example.test")
			s := startServer(t, cfg)
			addr := s.Listeners()[p.listener]
			// One session first, so that what every session shares (the
			// login cache, the mailbox's state) is in the baseline. POP3
			// holds the maildrop lock: its sessions are for one user each.
			open := func() (net.Conn, error) { return steps(addr, p.steps) }
			if p.listener == "pop3" {
				var users []string
				for i := range n + 1 {
					users = append(users, fmt.Sprintf("p%04d@example.test", i))
				}
				s.Shutdown(t.Context())
				addUser(t, cfg, users...)
				s = startServer(t, cfg)
				addr = s.Listeners()[p.listener]
				next := 0
				open = func() (net.Conn, error) {
					u := users[next]
					next++
					return steps(addr, [][3]string{{"", "+OK", "-ERR"}, {"USER " + u, "+OK", "-ERR"}, {"PASS password1", "+OK", "-ERR"}})
				}
			}
			first, err := open()
			if err != nil {
				t.Fatal(err)
			}
			defer first.Close()
			before := heldMemory()
			conns := make([]net.Conn, 0, n)
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for range n {
				c, err := open()
				if c != nil {
					conns = append(conns, c)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			after := heldMemory()
			per := (int64(after) - int64(before)) / n
			t.Logf("%d idle %s connections: %d KiB held in all, %.1f KiB each", n, p.listener, (int64(after)-int64(before))>>10, float64(per)/1024)
			if per > p.bound {
				t.Errorf("%d bytes per idle %s connection, over %d KiB", per, p.listener, p.bound>>10)
			}
		})
	}
}
