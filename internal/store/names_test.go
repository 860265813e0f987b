package store

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func TestCanonicalName(t *testing.T) {
	for in, want := range map[string]string{
		"INBOX": "INBOX", "inbox": "INBOX", "InBoX/Sub": "INBOX/Sub", "Inboxes": "Inboxes",
		"Sent": "Sent", "Archive/2026/Q1": "Archive/2026/Q1", "Ünïcode": "Ünïcode",
	} {
		if got, err := CanonicalName(in); err != nil || got != want {
			t.Errorf("CanonicalName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "/a", "a/", "a//b", "a\x00b", "a\rb", "\xff", strings.Repeat("x", 1025)} {
		if _, err := CanonicalName(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("CanonicalName(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

type chunky struct {
	parts []string
	err   error
}

func (c *chunky) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, c.err
	}
	n := copy(p, c.parts[0])
	c.parts[0] = c.parts[0][n:]
	if c.parts[0] == "" {
		c.parts = c.parts[1:]
	}
	return n, nil
}

func TestFillChunk(t *testing.T) {
	buf := make([]byte, 8)
	n, eof, err := FillChunk(&chunky{parts: []string{"ab", "cdefghij"}, err: io.EOF}, buf)
	if n != 8 || eof || err != nil || string(buf) != "abcdefgh" {
		t.Fatalf("full chunk: %d %v %v %q", n, eof, err, buf)
	}
	n, eof, err = FillChunk(&chunky{parts: []string{"ab"}, err: io.EOF}, buf)
	if n != 2 || !eof || err != nil {
		t.Fatalf("short final chunk: %d %v %v", n, eof, err)
	}
	n, eof, err = FillChunk(&chunky{parts: []string{"ab"}, err: io.ErrUnexpectedEOF}, buf)
	if n != 2 || eof || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("body cut short: %d %v %v", n, eof, err)
	}
}
