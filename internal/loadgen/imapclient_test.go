package loadgen

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scriptedIMAP serves one connection on 127.0.0.1:0: for each command the
// client sends (a line, plus an announced LITERAL+ literal), it calls
// reply with the command and writes what reply returns. It records the
// commands in the order received.
func scriptedIMAP(t *testing.T, reply func(cmd string, lit []byte) string) (addr string, cmds <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 64)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		defer close(out)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(time.Minute))
		r := bufio.NewReader(conn)
		io.WriteString(conn, "* OK ready\r\n")
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\r\n")
			var lit []byte
			if i := strings.LastIndex(line, "{"); i >= 0 && strings.HasSuffix(line, "+}") {
				n, _ := strconv.Atoi(line[i+1 : len(line)-2])
				lit = make([]byte, n+2)
				if _, err := io.ReadFull(r, lit); err != nil {
					return
				}
				lit = lit[:n]
			}
			out <- line
			io.WriteString(conn, reply(line, lit))
		}
	}()
	return ln.Addr().String(), out
}

func TestIMAPClient(t *testing.T) {
	var appended []byte
	addr, cmds := scriptedIMAP(t, func(cmd string, lit []byte) string {
		tag, rest, _ := strings.Cut(cmd, " ")
		switch {
		case strings.HasPrefix(rest, "LOGIN"):
			return tag + " OK logged in\r\n"
		case strings.HasPrefix(rest, "APPEND"):
			appended = lit
			return tag + " OK [APPENDUID 7 3] APPEND completed\r\n"
		case strings.HasPrefix(rest, "UID FETCH"):
			return "* 1 FETCH (UID 3 BODY[] {5}\r\nhello)\r\n" + tag + " OK done\r\n"
		case strings.HasPrefix(rest, "IDLE"):
			return "+ idling\r\n* 2 EXISTS\r\n"
		case cmd == "DONE":
			return "a4 OK IDLE terminated\r\n"
		case strings.HasPrefix(rest, "STORE"):
			return tag + " NO [CANNOT] refused\r\n"
		}
		return tag + " BAD unknown\r\n"
	})
	c, err := DialIMAP(t.Context(), nil, addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Login("u@x", `p"w`); err != nil {
		t.Fatal(err)
	}
	msg := []byte("Subject: x\r\n\r\nbody\r\n")
	text, err := c.Append("INBOX", msg, 1<<10, nil)
	if err != nil || text != "[APPENDUID 7 3] APPEND completed" || string(appended) != string(msg) {
		t.Fatalf("Append: %q, %v; server got %q", text, err, appended)
	}
	var lits []string
	if _, err := c.Command("UID FETCH 1:* BODY.PEEK[]", 1<<10, func(r *IMAPResponse) error {
		for _, l := range r.Literals {
			lits = append(lits, string(l))
		}
		return nil
	}); err != nil || len(lits) != 1 || lits[0] != "hello" {
		t.Fatalf("Command: literals %q, %v", lits, err)
	}
	var pushed []string
	text, err = c.Idle(time.Minute, 1<<10, func(r *IMAPResponse) (bool, error) {
		pushed = append(pushed, string(r.Lines[0]))
		return strings.HasSuffix(string(r.Lines[0]), "EXISTS"), nil
	})
	if err != nil || text != "IDLE terminated" || len(pushed) != 1 {
		t.Fatalf("Idle: %q, %v, pushed %q", text, err, pushed)
	}
	_, err = c.Command("STORE 1 +FLAGS (x)", 1<<10, nil)
	var se *IMAPStatusError
	if !errors.As(err, &se) || !strings.Contains(se.Line, "NO [CANNOT]") {
		t.Fatalf("refused command: %v, want an *IMAPStatusError", err)
	}
	c.Close()
	var got []string
	for cmd := range cmds {
		got = append(got, cmd)
	}
	want := []string{`a1 LOGIN "u@x" "p\"w"`, "a2 APPEND INBOX {20+}", "a3 UID FETCH 1:* BODY.PEEK[]", "a4 IDLE", "DONE", "a5 STORE 1 +FLAGS (x)"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("server received\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestIMAPClientIdleTimeout: with nothing pushed, Idle ends after its wait
// with DONE, and the session goes on.
func TestIMAPClientIdleTimeout(t *testing.T) {
	addr, _ := scriptedIMAP(t, func(cmd string, lit []byte) string {
		tag, rest, _ := strings.Cut(cmd, " ")
		switch {
		case strings.HasPrefix(rest, "IDLE"):
			return "+ idling\r\n"
		case cmd == "DONE":
			return "a1 OK IDLE terminated\r\n"
		}
		return tag + " OK fine\r\n"
	})
	c, err := DialIMAP(t.Context(), nil, addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Idle(200*time.Millisecond, 1<<10, func(*IMAPResponse) (bool, error) { return true, nil }); err != nil {
		t.Fatalf("Idle: %v", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("Idle returned after %v, before its wait", d)
	}
	if text, err := c.Command("NOOP", 1<<10, nil); err != nil || text != "fine" {
		t.Errorf("NOOP after IDLE: %q, %v", text, err)
	}
}
