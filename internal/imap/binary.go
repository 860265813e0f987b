package imap

import (
	"bytes"
	"encoding/base64"
	"io"
	"mime/quotedprintable"
	"strings"

	"quill/internal/mailbox"
	"quill/internal/mime"
)

// BINARY (RFC 3516, part of RFC 9051 section 6.4.5): the content of a
// part with its Content-Transfer-Encoding undone. Decoding streams twice
// over the stored part, once to size the literal and once to send it, so
// no part is held in memory whatever its size.

// binarySource locates a BINARY section: its stored range and the
// transfer encoding to undo. The whole message and multipart or message
// parts are sent as stored. ok is false if the part does not exist.
func binarySource(sum *mime.Summary, sec section, size int64) (r mime.Range, enc string, ok bool) {
	if len(sec.path) == 0 {
		return mime.Range{Start: 0, End: size}, "", true
	}
	pi, ok := sum.Part(sec.path)
	if !ok {
		return mime.Range{}, "", false
	}
	if pi.Part.IsMultipart() || pi.Part.IsMessage() {
		return pi.Body, "", true
	}
	return pi.Body, pi.Part.Encoding, true
}

// knownCTE reports whether enc is a transfer encoding this server can
// undo (RFC 2045 section 6.1); others get NO [UNKNOWN-CTE].
func knownCTE(enc string) bool {
	switch strings.ToLower(enc) {
	case "", "7bit", "8bit", "binary", "base64", "quoted-printable":
		return true
	}
	return false
}

// decoder returns r with enc undone. Malformed encoded data ends the
// decoded content where it stops making sense, the same way on every
// read, so the sizing pass and the sending pass agree.
func decodeCTE(r io.Reader, enc string) io.Reader {
	switch strings.ToLower(enc) {
	case "base64":
		return stopAtError{base64.NewDecoder(base64.StdEncoding, base64Clean{r})}
	case "quoted-printable":
		return stopAtError{quotedprintable.NewReader(r)}
	}
	return r
}

// base64Clean drops the octets outside the base64 alphabet (RFC 2045
// section 6.8: they must be ignored), keeping '='.
type base64Clean struct{ r io.Reader }

func (b base64Clean) Read(p []byte) (int, error) {
	for {
		n, err := b.r.Read(p)
		k := 0
		for _, c := range p[:n] {
			if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=' {
				p[k] = c
				k++
			}
		}
		if k > 0 || err != nil {
			return k, err
		}
	}
}

// stopAtError turns a decoding error into the end of the content.
type stopAtError struct{ r io.Reader }

func (s stopAtError) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = io.EOF
	}
	return n, err
}

// binaryInfo sizes a decoded section and says whether it holds NUL, which
// makes it a literal8 (RFC 9051 section 4.3.1).
func binaryInfo(body io.ReaderAt, r mime.Range, enc string) (size int64, hasNUL bool, err error) {
	buf := make([]byte, 32<<10)
	dr := decodeCTE(io.NewSectionReader(body, r.Start, r.Len()), enc)
	for {
		n, rerr := dr.Read(buf)
		size += int64(n)
		if !hasNUL && bytes.IndexByte(buf[:n], 0) >= 0 {
			hasNUL = true
		}
		if rerr == io.EOF {
			return size, hasNUL, nil
		}
		if rerr != nil {
			return 0, false, rerr
		}
	}
}

// writeBinary writes one BINARY[...] or BINARY.SIZE[...] item.
func (s *session) writeBinary(m mailbox.Message, body mailbox.BodyReader, sum *mime.Summary, it fetchItem) error {
	e := &s.enc
	r, enc, ok := binarySource(sum, it.sec, m.Size)
	if it.name == "BINARY.SIZE[]" {
		e.raw("BINARY.SIZE[").raw(it.sec.String()).raw("] ")
		if !ok {
			e.raw("0")
			return nil
		}
		n, _, err := binaryInfo(body, r, enc)
		if err != nil {
			return err
		}
		e.num64(uint64(n))
		return nil
	}
	e.raw("BINARY[").raw(it.sec.String()).raw("]")
	if it.partial {
		e.raw("<").num(it.offset).raw(">")
	}
	if !ok {
		e.raw(" NIL")
		return nil
	}
	n, hasNUL, err := binaryInfo(body, r, enc)
	if err != nil {
		return err
	}
	off := int64(0)
	if it.partial {
		off = min(int64(it.offset), n)
		n = min(n-off, int64(it.count))
	}
	e.sp()
	if hasNUL {
		e.raw("~")
	}
	if err := s.conn.GrowWriteBuffer(bodyBufSize); err != nil {
		return err
	}
	e.raw("{").num64(uint64(n)).raw("}\r\n")
	dr := decodeCTE(io.NewSectionReader(body, r.Start, r.Len()), enc)
	if _, err := io.CopyN(io.Discard, dr, off); err != nil {
		return err
	}
	_, err = io.CopyN(s.conn, dr, n)
	return err
}
