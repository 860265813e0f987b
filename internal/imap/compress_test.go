package imap

import (
	"bufio"
	"compress/flate"
	"encoding/hex"
	"io"
	"net/netip"
	"strings"
	"testing"
)

// TestCompressPartialFlush sends commands compressed as mbsync does, each
// ended by zlib's Z_PARTIAL_FLUSH (an empty fixed-Huffman block that leaves
// the stream unaligned), and reads the answers with the standard library's
// raw deflate reader. The fixture bytes are Python's
// zlib.compressobj(wbits=-15): compress(b"a2 NOOP\r\n") +
// flush(Z_PARTIAL_FLUSH), then the same for b"a3 LOGOUT\r\n".
func TestCompressPartialFlush(t *testing.T) {
	backend := newTestBackend(t)
	srv := &Server{Hostname: "imap.test", Backend: backend, Logger: testLogger(t)}
	addr := startServer(t, srv, netip.Addr{})
	c := dial(t, addr, nil)
	c.readLines()
	c.command("a0 LOGIN alice secret")
	if got := c.command("a1 COMPRESS DEFLATE"); got[len(got)-1] != "a1 OK DEFLATE active" {
		t.Fatalf("COMPRESS: %q", got)
	}
	if c.r.Buffered() != 0 {
		t.Fatal("octets after the COMPRESS response")
	}
	zr := bufio.NewReader(flate.NewReader(c.conn))
	for _, step := range []struct{ hex, want string }{
		{"4a3452f0f3f70fe0e50208", "a2 OK NOOP completed\r\n"},
		{"a04463051f7f77ffd0105e2e8000", "* BYE logging out\r\na3 OK LOGOUT completed\r\n"},
	} {
		b, err := hex.DecodeString(step.hex)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.conn.Write(b); err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		for got.Len() < len(step.want) {
			line, err := zr.ReadString('\n')
			got.WriteString(line)
			if err != nil {
				t.Fatalf("after %q: %v", got.String(), err)
			}
		}
		if got.String() != step.want {
			t.Fatalf("got %q, want %q", got.String(), step.want)
		}
	}
	if _, err := zr.ReadByte(); err != io.EOF && err != io.ErrUnexpectedEOF {
		t.Fatalf("after LOGOUT: %v, want end of stream", err)
	}
}
