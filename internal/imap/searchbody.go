package imap

import (
	"bytes"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/htmlindex"

	"quill/internal/mime"
)

// SEARCH BODY and TEXT (RFC 3501 and RFC 9051 section 6.4.4) compare the
// search string with the decoded text of the message, case-insensitively
// (Unicode simple case mapping, as the header keys do):
//
//   - every text/* leaf part, including those inside message/rfc822 parts,
//     with its Content-Transfer-Encoding undone (the BINARY decoders) and
//     its charset converted to UTF-8 through the WHATWG index; an unknown
//     charset, or us-ascii (often mislabelled 8-bit mail), is taken as
//     UTF-8 when the whole decoded part is valid UTF-8 and as ISO-8859-1
//     otherwise;
//   - the decoded header fields ("Name: text") of every encapsulated
//     message, and, for TEXT only, of the message itself.
//
// Other parts (images, application/*), preambles and epilogues are never
// searched, so a binary attachment cannot match by accident.
//
// A part is read in chunks of searchChunk octets; the window kept is one
// chunk plus the last len(needle)-1 octets of lowered text, so a match
// spanning two chunks is found and memory per part is bounded whatever its
// size. Part sizes and counts are bounded by mime.MaxParts and the
// message size. An encapsulated header is read up to maxHeaderKept
// octets; fields beyond it are not searched.

// searchChunk is the number of decoded octets matched at a time.
const searchChunk = 32 << 10

// bodyMatcher finds one needle in the decoded text of a message. Its
// buffers are reused across parts and messages.
type bodyMatcher struct {
	needle []byte // lower-cased search string
	buf    []byte // one chunk, preceded by an incomplete rune carried over
	win    []byte // lower-cased text: the kept overlap, then the current chunk
}

func newBodyMatcher(needle string) *bodyMatcher {
	return &bodyMatcher{
		needle: appendLower(nil, []byte(needle)),
		buf:    make([]byte, utf8.UTFMax+searchChunk),
	}
}

// appendLower appends the simple lower-case mapping of the UTF-8 text b
// to dst; an invalid octet becomes U+FFFD, as strings.ToLower makes it.
func appendLower(dst, b []byte) []byte {
	for len(b) > 0 {
		if c := b[0]; c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			dst = append(dst, c)
			b = b[1:]
			continue
		}
		r, n := utf8.DecodeRune(b)
		dst = utf8.AppendRune(dst, unicode.ToLower(r))
		b = b[n:]
	}
	return dst
}

// incompleteTail returns the length of the truncated UTF-8 sequence that
// ends b, or 0 if b ends on a rune boundary (or in invalid octets, which
// decode the same whatever follows).
func incompleteTail(b []byte) int {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		c := b[len(b)-i]
		if utf8.RuneStart(c) {
			if c >= utf8.RuneSelf && !utf8.FullRune(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}

// feed adds lower-cased text to the window and reports a match; the
// window then keeps only what a later match may still start in.
func (bm *bodyMatcher) feed(text []byte) bool {
	bm.win = appendLower(bm.win, text)
	if bytes.Contains(bm.win, bm.needle) {
		return true
	}
	if keep := len(bm.needle) - 1; len(bm.win) > keep {
		bm.win = bm.win[:copy(bm.win, bm.win[len(bm.win)-keep:])]
	}
	return false
}

// stream reports whether the UTF-8 text read from r contains the needle.
func (bm *bodyMatcher) stream(r io.Reader) (bool, error) {
	bm.win = bm.win[:0]
	return bm.eachChunk(r, bm.feed)
}

// validUTF8 reports whether all of r is valid UTF-8, reading it in chunks.
func (bm *bodyMatcher) validUTF8(r io.Reader) (bool, error) {
	valid := true
	_, err := bm.eachChunk(r, func(data []byte) bool {
		valid = utf8.Valid(data)
		return !valid
	})
	return valid, err
}

// eachChunk reads r through bm.buf and calls f with each chunk, never
// splitting a UTF-8 sequence between chunks (the last chunk takes whatever
// remains), until f returns true or r ends; it reports whether f did.
func (bm *bodyMatcher) eachChunk(r io.Reader, f func([]byte) bool) (bool, error) {
	carry := 0
	for {
		n, err := r.Read(bm.buf[carry:])
		data := bm.buf[:carry+n]
		if err != nil {
			if err != io.EOF {
				return false, err
			}
			return f(data), nil
		}
		k := incompleteTail(data)
		if f(data[:len(data)-k]) {
			return true, nil
		}
		carry = copy(bm.buf, data[len(data)-k:])
	}
}

// message reports whether the decoded text of the message (or
// encapsulated message) p matches; withHeader adds p's own header fields.
func (bm *bodyMatcher) message(body io.ReaderAt, p *mime.Part, withHeader bool) (bool, error) {
	if withHeader {
		hdr := make([]byte, min(p.BodyStart-p.HeaderStart, maxHeaderKept))
		if _, err := body.ReadAt(hdr, p.HeaderStart); err != nil && err != io.EOF {
			return false, fmt.Errorf("imap: reading an encapsulated header: %w", err)
		}
		if headerTextMatch(hdr, bm.needle) {
			return true, nil
		}
	}
	return bm.entity(body, p)
}

// entity searches one MIME entity as the comment at the top says.
func (bm *bodyMatcher) entity(body io.ReaderAt, p *mime.Part) (bool, error) {
	switch {
	case p.IsMultipart():
		for _, c := range p.Children {
			if ok, err := bm.entity(body, c); ok || err != nil {
				return ok, err
			}
		}
		return false, nil
	case p.IsMessage():
		return bm.message(body, p.Message, true)
	case p.Type == "text":
		return bm.text(body, p)
	}
	return false, nil
}

// text searches one text part.
func (bm *bodyMatcher) text(body io.ReaderAt, p *mime.Part) (bool, error) {
	open := func() io.Reader {
		return decodeCTE(io.NewSectionReader(body, p.BodyStart, p.End-p.BodyStart), p.Encoding)
	}
	cs := p.Charset()
	switch cs {
	case "utf-8", "utf8":
		return bm.stream(open())
	case "us-ascii", "ascii":
	default:
		if enc, err := htmlindex.Get(cs); err == nil {
			return bm.stream(enc.NewDecoder().Reader(open()))
		}
	}
	valid, err := bm.validUTF8(open())
	if err != nil {
		return false, err
	}
	if valid {
		return bm.stream(open())
	}
	return bm.stream(charmap.ISO8859_1.NewDecoder().Reader(open()))
}
