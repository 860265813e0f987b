package pop3

import (
	"bytes"
	"errors"
	"io"
)

// errTopDone is returned by a dotWriter in TOP mode once the requested body
// lines have been written, so that the copy stops reading the message.
var errTopDone = errors.New("pop3: TOP line count reached")

// dotWriter streams a message as the body of a multi-line response
// (RFC 1939 section 3): a line that starts with "." gets another "."
// (byte-stuffing), a bare LF becomes CRLF so that every line on the wire
// ends in CRLF, and Close ends the response with ".\r\n". It holds no more
// than one line's state, never the message.
//
// In TOP mode (RFC 1939 section 7) it passes the header, the blank line
// that ends it, and then at most top body lines; after that Write returns
// errTopDone.
type dotWriter struct {
	w       io.Writer
	bol     bool // at the beginning of a line
	prevCR  bool // the last octet written was CR
	lineLen int  // octets of the current line so far, CR included

	top      bool // TOP mode
	inBody   bool // TOP: past the header
	topLeft  int  // TOP: body lines still to write
	done     bool // TOP: the line count is reached
	finished bool // Close has run
}

var (
	crlf         = []byte("\r\n")
	cr           = []byte("\r")
	lf           = []byte("\n")
	dot          = []byte(".")
	endMultiline = []byte(".\r\n")
)

func newDotWriter(w io.Writer) *dotWriter {
	return &dotWriter{w: w, bol: true}
}

// newTopWriter returns a dotWriter for "TOP msg n" with n = lines.
func newTopWriter(w io.Writer, lines int) *dotWriter {
	return &dotWriter{w: w, bol: true, top: true, topLeft: lines}
}

func (d *dotWriter) Write(p []byte) (int, error) {
	if d.done {
		return 0, errTopDone
	}
	if !d.top {
		return d.writeRuns(p)
	}
	n := len(p)
	for len(p) > 0 {
		if d.bol {
			if p[0] == '.' {
				if _, err := d.w.Write(dot); err != nil {
					return 0, err
				}
			}
			d.bol = false
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if _, err := d.w.Write(p); err != nil {
				return 0, err
			}
			d.lineLen += len(p)
			d.prevCR = p[len(p)-1] == '\r'
			return n, nil
		}
		crBefore := d.prevCR
		if i > 0 {
			crBefore = p[i-1] == '\r'
		}
		if _, err := d.w.Write(p[:i]); err != nil {
			return 0, err
		}
		eol := crlf
		if crBefore {
			eol = lf
		}
		if _, err := d.w.Write(eol); err != nil {
			return 0, err
		}
		d.lineLen += i
		empty := d.lineLen == 0 || d.lineLen == 1 && crBefore
		d.bol, d.prevCR, d.lineLen = true, false, 0
		p = p[i+1:]
		if d.top && d.countLine(empty) {
			d.done = true
			return n, errTopDone
		}
	}
	return n, nil
}

// writeRuns is Write outside TOP mode. It passes on each run of bytes that
// needs no change with one write: a message's lines mostly end in CRLF and
// seldom start with ".", and two writes per line were most of RETR's cost
// in the server's own code.
func (d *dotWriter) writeRuns(p []byte) (int, error) {
	start := 0 // p[start:i] goes out unchanged
	for i := 0; i < len(p); {
		if d.bol {
			d.bol = false
			if p[i] == '.' {
				if err := d.put(p[start:i], dot); err != nil {
					return 0, err
				}
				start = i
			}
		}
		j := bytes.IndexByte(p[i:], '\n')
		if j < 0 {
			d.prevCR = p[len(p)-1] == '\r'
			break
		}
		lf := i + j
		if crBefore := j > 0 && p[lf-1] == '\r' || j == 0 && d.prevCR; !crBefore {
			if err := d.put(p[start:lf], cr); err != nil {
				return 0, err
			}
			start = lf
		}
		d.bol, d.prevCR = true, false
		i = lf + 1
	}
	if start < len(p) {
		if _, err := d.w.Write(p[start:]); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// put writes run and then extra.
func (d *dotWriter) put(run, extra []byte) error {
	if len(run) > 0 {
		if _, err := d.w.Write(run); err != nil {
			return err
		}
	}
	_, err := d.w.Write(extra)
	return err
}

// countLine accounts one finished line in TOP mode and reports whether the
// output is complete.
func (d *dotWriter) countLine(empty bool) bool {
	if !d.inBody {
		if empty {
			d.inBody = true
			return d.topLeft == 0
		}
		return false
	}
	d.topLeft--
	return d.topLeft <= 0
}

// Close terminates an unfinished last line and writes the final ".\r\n".
// It does not close the underlying writer.
func (d *dotWriter) Close() error {
	if d.finished {
		return nil
	}
	d.finished = true
	if !d.bol {
		eol := crlf
		if d.prevCR {
			eol = lf
		}
		if _, err := d.w.Write(eol); err != nil {
			return err
		}
	}
	_, err := d.w.Write(endMultiline)
	return err
}
