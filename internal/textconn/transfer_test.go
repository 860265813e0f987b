package textconn

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// A peer that stops sending during a transfer is cut off once its
// allowance (grace + octets/rate) is spent, well before the read timeout.
func TestTransferCutsOffStalledPeer(t *testing.T) {
	c, client := pipe(t, Options{ReadTimeout: time.Minute})
	if _, err := client.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.BeginTransfer(1<<20, 200*time.Millisecond)
	defer c.EndTransfer()
	n, err := io.Copy(io.Discard, c.Reader())
	if !errors.Is(err, ErrTooSlow) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d octets, err %v; want ErrTooSlow", n, err)
	}
	if n != 1000 {
		t.Fatalf("read %d octets before the cut, want 1000", n)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("cut off after %v", d)
	}
	// The allowance is spent: further reads fail at once.
	if _, err := c.Reader().ReadByte(); !errors.Is(err, ErrTooSlow) {
		t.Fatalf("read after the cut: %v", err)
	}
}

// A peer above the rate is never cut off, however long the transfer, and
// the transfer's end restores the ordinary timeouts.
func TestTransferKeepsFastPeer(t *testing.T) {
	c, client := pipe(t, Options{ReadTimeout: time.Minute})
	const total = 8 << 20
	go func() {
		buf := make([]byte, 64<<10)
		for sent := 0; sent < total; sent += len(buf) {
			if _, err := client.Write(buf); err != nil {
				return
			}
		}
		io.WriteString(client, "after\r\n")
	}()
	c.BeginTransfer(1<<10, time.Second)
	if n, err := io.CopyN(io.Discard, c.Reader(), total); err != nil {
		t.Fatalf("after %d octets: %v", n, err)
	}
	c.EndTransfer()
	if line, err := c.ReadLine(); err != nil || string(line) != "after" {
		t.Fatalf("ReadLine after the transfer: %q, %v", line, err)
	}
}

// Command lines read during a transfer (BDAT between chunks) share its
// allowance.
func TestTransferBoundsReadLine(t *testing.T) {
	c, client := pipe(t, Options{ReadTimeout: time.Minute})
	io.WriteString(client, "BDAT 10")
	c.BeginTransfer(1<<20, 200*time.Millisecond)
	defer c.EndTransfer()
	if _, err := c.ReadLine(); !errors.Is(err, ErrTooSlow) {
		t.Fatalf("ReadLine of an unfinished line: %v, want ErrTooSlow", err)
	}
}
