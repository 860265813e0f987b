package smtp

import (
	"bufio"
	"errors"
	"io"
)

// dataReader decodes a DATA body (RFC 5321 section 4.5.2) as it streams
// from the connection: it removes dot-stuffing, normalises bare LF line
// endings to CRLF, stops at the end-of-data line and enforces the message
// and text-line limits.
//
// End of data is only "." on a line of its own with CRLF before and after
// (RFC 5321 section 4.1.1.4). A "." line ended or preceded by a bare LF is
// ordinary content: accepting it as the end would allow SMTP smuggling,
// where a second message hides inside the first for a server that reads
// the end differently from the relay before it.
//
// Over a limit, Read returns errMessageTooBig or errDataLineTooLong (so
// Deliver aborts); drain then consumes the rest of the body, holding at
// most one buffer of it, so the session can reply and stay in sync.
type dataReader struct {
	br      *bufio.Reader
	maxSize int64
	maxLine int

	n        int64 // body octets produced
	lineLen  int   // octets of the current line so far
	midLine  bool  // a fragment of the current line has been consumed
	heldCR   bool  // the last fragment ended in CR, not yet emitted
	prevCRLF bool  // the previous line ended with CRLF (true at the start)
	tooLong  bool  // some line exceeded maxLine

	pending [3][]byte // output not yet returned: stray CR, content, line end
	done    bool      // end-of-data line consumed
	ioErr   error     // connection failure; sticky
	err     error     // what Read returns once pending is empty
	eofSeen bool      // Read returned io.EOF: the consumer has the whole body
}

var (
	crlf = []byte("\r\n")
	cr   = []byte("\r")
)

func newDataReader(br *bufio.Reader, maxSize int64, maxLine int) *dataReader {
	return &dataReader{br: br, maxSize: maxSize, maxLine: maxLine, prevCRLF: true}
}

func (r *dataReader) Read(p []byte) (int, error) {
	for {
		if n := r.copyPending(p); n > 0 {
			return n, nil
		}
		if r.err != nil {
			return 0, r.err
		}
		if r.done {
			r.eofSeen = true
			return 0, io.EOF
		}
		produced, err := r.fill()
		switch {
		case err != nil:
			r.ioErr, r.err = err, err
		case r.tooLong:
			r.err = errDataLineTooLong
		case r.n+int64(produced) > r.maxSize:
			r.err = errMessageTooBig
		default:
			r.n += int64(produced)
			continue
		}
		r.pending = [3][]byte{}
	}
}

func (r *dataReader) copyPending(p []byte) int {
	n := 0
	for i := range r.pending {
		for len(r.pending[i]) > 0 && n < len(p) {
			c := copy(p[n:], r.pending[i])
			n += c
			r.pending[i] = r.pending[i][c:]
		}
	}
	return n
}

// fill consumes one fragment of input (a line, or a buffer's worth of a
// longer one) and sets pending to its decoded form.
func (r *dataReader) fill() (produced int, err error) {
	frag, err := r.br.ReadSlice('\n')
	full := err == nil
	if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	var stray []byte
	if r.heldCR {
		r.heldCR = false
		if full && len(frag) == 1 { // the LF completing a split CRLF
			r.endLine(true)
			r.pending = [3][]byte{nil, nil, crlf}
			return len(crlf), nil
		}
		stray = cr // a CR inside the line, kept as it is
	}
	if !full {
		if !r.midLine && frag[0] == '.' {
			frag = frag[1:]
		}
		r.midLine = true
		if n := len(frag); n > 0 && frag[n-1] == '\r' {
			frag, r.heldCR = frag[:n-1], true
		}
		r.addLine(len(stray) + len(frag))
		r.pending = [3][]byte{stray, frag, nil}
		return len(stray) + len(frag), nil
	}
	content, endsCRLF := frag[:len(frag)-1], false
	if n := len(content); n > 0 && content[n-1] == '\r' {
		content, endsCRLF = content[:n-1], true
	}
	if !r.midLine {
		if len(content) == 1 && content[0] == '.' && endsCRLF && r.prevCRLF {
			r.done = true
			return 0, nil
		}
		if len(content) > 1 && content[0] == '.' {
			content = content[1:]
		}
	}
	r.addLine(len(stray) + len(content))
	r.endLine(endsCRLF)
	r.pending = [3][]byte{stray, content, crlf}
	return len(stray) + len(content) + len(crlf), nil
}

func (r *dataReader) addLine(n int) {
	r.lineLen += n
	if r.lineLen > r.maxLine {
		r.tooLong = true
	}
}

func (r *dataReader) endLine(endsCRLF bool) {
	r.lineLen, r.midLine, r.prevCRLF = 0, false, endsCRLF
}

// drain consumes input up to and including the end-of-data line, discarding
// it. It returns a connection error, if any.
func (r *dataReader) drain() error {
	r.pending = [3][]byte{}
	for !r.done {
		if r.ioErr != nil {
			return r.ioErr
		}
		if _, err := r.fill(); err != nil {
			r.ioErr = err
		}
		r.pending = [3][]byte{}
	}
	return nil
}

// crlfNormalizer turns bare LF into CRLF in a stream (BDAT bodies, which are
// not dot-stuffed and may be split anywhere, RFC 3030 section 2).
type crlfNormalizer struct {
	r      io.Reader
	lastCR bool
	err    error
	buf    []byte
	out    []byte
}

func newCRLFNormalizer(r io.Reader) *crlfNormalizer {
	return &crlfNormalizer{r: r, buf: make([]byte, 16<<10)}
}

func (c *crlfNormalizer) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		var n int
		n, c.err = c.r.Read(c.buf)
		c.out = c.expand(c.buf[:n])
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	return n, nil
}

// expand returns b with bare LFs turned into CRLF; b itself when it has none.
func (c *crlfNormalizer) expand(b []byte) []byte {
	bare := 0
	prev := c.lastCR
	for _, x := range b {
		if x == '\n' && !prev {
			bare++
		}
		prev = x == '\r'
	}
	if bare == 0 {
		c.lastCR = prev
		return b
	}
	out := make([]byte, 0, len(b)+bare)
	for _, x := range b {
		if x == '\n' && !c.lastCR {
			out = append(out, '\r')
		}
		out = append(out, x)
		c.lastCR = x == '\r'
	}
	return out
}
