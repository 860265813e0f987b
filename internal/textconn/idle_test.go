package textconn

import (
	"crypto/tls"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// With ReleaseIdle, lines that arrive after the buffers were handed back
// are read whole, however long, and the output buffer comes back on use.
func TestReleaseIdleReadsAcrossIdle(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 64 << 10, ReadTimeout: 10 * time.Second, ReleaseIdle: true})
	long := strings.Repeat("x", 3*idleReadSize)
	go func() {
		io.WriteString(client, "a1 NOOP\r\n")
		io.WriteString(client, long+"\r\nb1 NOOP\r\nc1 APPEND {5}\r\n")
		io.WriteString(client, "hello\r\n")
		io.WriteString(client, strings.Repeat("y", 70<<10)+"\r\nd1 LOGOUT\r\n")
	}()
	for _, want := range []string{"a1 NOOP", long, "b1 NOOP", "c1 APPEND {5}"} {
		line, err := c.ReadLine()
		if err != nil || string(line) != want {
			t.Fatalf("ReadLine = %.40q, %v; want %.40q", line, err, want)
		}
		if _, err := c.WriteString("* OK\r\n"); err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if c.bw != nil {
			t.Fatal("output buffer kept after Flush")
		}
	}
	lit := make([]byte, 5)
	if _, err := io.ReadFull(c.Reader(), lit); err != nil || string(lit) != "hello" {
		t.Fatalf("literal %q, %v", lit, err)
	}
	if line, err := c.ReadLine(); err != nil || len(line) != 0 {
		t.Fatalf("after literal: %q, %v", line, err)
	}
	if _, err := c.ReadLine(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("over-long line after idle: %v", err)
	}
	if line, err := c.ReadLine(); err != nil || string(line) != "d1 LOGOUT" {
		t.Fatalf("after the long line: %q, %v", line, err)
	}
	c.Release()
}

// STARTTLS works on a connection that released its buffers, and output
// written while a read waits (IMAP IDLE) is unaffected.
func TestReleaseIdleStartTLS(t *testing.T) {
	serverCfg, clientCfg := testTLS(t)
	c, client := pipe(t, Options{ReadTimeout: 10 * time.Second, ReleaseIdle: true, HandshakeTimeout: 10 * time.Second})
	io.WriteString(client, "STARTTLS\r\n")
	if line, err := c.ReadLine(); err != nil || string(line) != "STARTTLS" {
		t.Fatalf("%q, %v", line, err)
	}
	done := make(chan error, 1)
	go func() {
		tc := tls.Client(client, clientCfg)
		if err := tc.Handshake(); err != nil {
			done <- err
			return
		}
		io.WriteString(tc, "a LOGIN\r\n")
		buf := make([]byte, 6)
		_, err := io.ReadFull(tc, buf)
		if err == nil && string(buf) != "* OK\r\n" {
			err = errors.New("got " + string(buf))
		}
		done <- err
	}()
	if err := c.StartTLS(serverCfg); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		line, _ := c.ReadLine()
		lines <- string(line)
	}()
	c.WriteString("* OK\r\n")
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if l := <-lines; l != "a LOGIN" {
		t.Fatalf("over TLS: %q", l)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
