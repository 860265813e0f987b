package pop3

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// writeChunks writes msg through w in pieces of at most chunk octets and
// returns the first error.
func writeChunks(w *dotWriter, msg []byte, chunk int) error {
	for len(msg) > 0 {
		n := min(chunk, len(msg))
		if _, err := w.Write(msg[:n]); err != nil {
			return err
		}
		msg = msg[n:]
	}
	return nil
}

func TestDotWriter(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ".\r\n"},
		{"a\r\n", "a\r\n.\r\n"},
		{"a", "a\r\n.\r\n"},
		{"a\r", "a\r\n.\r\n"},
		{".\r\n", "..\r\n.\r\n"},
		{"a\r\n.b\r\n..c\r\n.", "a\r\n..b\r\n...c\r\n..\r\n.\r\n"},
		{"bare\nlf\n.x\n", "bare\r\nlf\r\n..x\r\n.\r\n"},
		{"cr\rmid\r\n", "cr\rmid\r\n.\r\n"},
		{"\r\n\r\n", "\r\n\r\n.\r\n"},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 2, 3, 1 << 20} {
			var out bytes.Buffer
			w := newDotWriter(&out)
			if err := writeChunks(w, []byte(tt.in), chunk); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("chunk %d: %q => %q, want %q", chunk, tt.in, out.String(), tt.want)
			}
		}
	}
}

func TestTopWriter(t *testing.T) {
	const msg = "Subject: x\r\nFrom: a@b\r\n\r\nline1\r\n.line2\r\nline3\r\n"
	tests := []struct {
		in    string
		lines int
		want  string
	}{
		{msg, 0, "Subject: x\r\nFrom: a@b\r\n\r\n.\r\n"},
		{msg, 1, "Subject: x\r\nFrom: a@b\r\n\r\nline1\r\n.\r\n"},
		{msg, 2, "Subject: x\r\nFrom: a@b\r\n\r\nline1\r\n..line2\r\n.\r\n"},
		{msg, 99, "Subject: x\r\nFrom: a@b\r\n\r\nline1\r\n..line2\r\nline3\r\n.\r\n"},
		{"Subject: only header\r\n", 5, "Subject: only header\r\n.\r\n"},
		{"Subject: lf\n\nbody\nmore\n", 1, "Subject: lf\r\n\r\nbody\r\n.\r\n"},
		{"\r\nbody\r\n", 0, "\r\n.\r\n"},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 5, 1 << 20} {
			var out bytes.Buffer
			w := newTopWriter(&out, tt.lines)
			if err := writeChunks(w, []byte(tt.in), chunk); err != nil && !errors.Is(err, errTopDone) {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("TOP %d chunk %d: %q => %q, want %q", tt.lines, chunk, tt.in, out.String(), tt.want)
			}
		}
	}
}

// unstuff reverses a multi-line response body (RFC 1939 section 3) and
// reports whether it was well formed: CRLF after every line, the ".\r\n"
// terminator last and nowhere else.
func unstuff(out []byte) ([]byte, bool) {
	if !bytes.HasSuffix(out, endMultiline) {
		return nil, false
	}
	body := out[:len(out)-len(endMultiline)]
	var dec bytes.Buffer
	for len(body) > 0 {
		i := bytes.IndexByte(body, '\n')
		if i < 1 || body[i-1] != '\r' {
			return nil, false
		}
		line := body[:i+1]
		if line[0] == '.' {
			if i == 2 { // ".\r\n" before the end would terminate early
				return nil, false
			}
			line = line[1:]
		}
		dec.Write(line)
		body = body[i+1:]
	}
	return dec.Bytes(), true
}

// normalize is what a dotWriter must transmit for msg, before stuffing.
func normalize(msg []byte) []byte {
	var b bytes.Buffer
	for i, c := range msg {
		if c == '\n' && (i == 0 || msg[i-1] != '\r') {
			b.WriteByte('\r')
		}
		b.WriteByte(c)
	}
	if b.Len() > 0 && !bytes.HasSuffix(b.Bytes(), lf) {
		if bytes.HasSuffix(b.Bytes(), []byte("\r")) {
			b.WriteByte('\n')
		} else {
			b.Write(crlf)
		}
	}
	return b.Bytes()
}

func FuzzDotWriter(f *testing.F) {
	f.Add([]byte("a\r\n.b\r\n"), uint8(1))
	f.Add([]byte(".\n.\r\n\r.."), uint8(2))
	f.Add([]byte(strings.Repeat("x", 300)+"\r"), uint8(7))
	f.Fuzz(func(t *testing.T, msg []byte, chunk uint8) {
		var out bytes.Buffer
		w := newDotWriter(&out)
		if err := writeChunks(w, msg, int(chunk)+1); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		dec, ok := unstuff(out.Bytes())
		if !ok {
			t.Fatalf("malformed output %q for %q", out.Bytes(), msg)
		}
		if want := normalize(msg); !bytes.Equal(dec, want) {
			t.Fatalf("decoded %q, want %q", dec, want)
		}
	})
}
