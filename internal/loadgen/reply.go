package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Limits on what the server may send. RFC 5321 section 4.5.3.1.5 caps a
// reply line at 512 octets; we allow more so that a verbose server is
// reported as what it is rather than as a protocol error, but never an
// unbounded amount.
const (
	maxReplyLine  = 2048
	maxReplyLines = 128
)

// ErrProtocol is wrapped by every malformed server response.
var ErrProtocol = errors.New("loadgen: protocol error")

// parseReplyLine parses one SMTP reply line without its CRLF (RFC 5321
// section 4.2: Reply-code [ ("-" / SP) textstring ]). It returns the code,
// whether more lines follow, and the text.
func parseReplyLine(line []byte) (code int, more bool, text []byte, err error) {
	if len(line) < 3 {
		return 0, false, nil, fmt.Errorf("%w: short reply line %q", ErrProtocol, line)
	}
	for i := 0; i < 3; i++ {
		c := line[i]
		if c < '0' || c > '9' {
			return 0, false, nil, fmt.Errorf("%w: bad reply code %q", ErrProtocol, line)
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code > 599 {
		return 0, false, nil, fmt.Errorf("%w: reply code %d out of range", ErrProtocol, code)
	}
	if len(line) == 3 {
		return code, false, nil, nil
	}
	switch line[3] {
	case '-':
		more = true
	case ' ':
	default:
		return 0, false, nil, fmt.Errorf("%w: bad reply separator %q", ErrProtocol, line)
	}
	return code, more, line[4:], nil
}

// readLine reads one CRLF- (or bare LF-) terminated line of at most max
// octets and returns it without the terminator. The slice is valid until the
// next read from r.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) || len(line) > max {
		return nil, fmt.Errorf("%w: line longer than %d octets", ErrProtocol, max)
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// readReply reads one complete, possibly multi-line, reply. When lines is
// non-nil the text of every line is appended to it. The text of the last
// line is returned and valid until the next read from r.
func readReply(r *bufio.Reader, lines *[]string) (int, []byte, error) {
	code := 0
	for n := 0; ; n++ {
		if n == maxReplyLines {
			return 0, nil, fmt.Errorf("%w: reply longer than %d lines", ErrProtocol, maxReplyLines)
		}
		line, err := readLine(r, maxReplyLine)
		if err != nil {
			return 0, nil, err
		}
		c, more, text, err := parseReplyLine(line)
		if err != nil {
			return 0, nil, err
		}
		if n > 0 && c != code {
			return 0, nil, fmt.Errorf("%w: reply code changed from %d to %d", ErrProtocol, code, c)
		}
		code = c
		if lines != nil {
			*lines = append(*lines, string(text))
		}
		if !more {
			return code, text, nil
		}
	}
}

// lineConn is the client side of a line-oriented session (POP3, IMAP):
// every command and every reply gets its own timeout, and the end of ctx
// expires the deadline at once (the caller defers watch(ctx, conn)()).
// Reads go through a buffer of maxMessageLine+2 octets, so readLine may be
// given any bound up to maxMessageLine.
type lineConn struct {
	ctx     context.Context
	conn    net.Conn
	r       *bufio.Reader
	w       *bufio.Writer
	timeout time.Duration
}

func newLineConn(ctx context.Context, conn net.Conn, timeout time.Duration) *lineConn {
	return &lineConn{ctx: ctx, conn: conn, r: bufio.NewReaderSize(conn, maxMessageLine+2), w: bufio.NewWriter(conn), timeout: timeout}
}

// writeLine sends line and CRLF.
func (c *lineConn) writeLine(line string) error {
	c.arm()
	if _, err := c.w.WriteString(line); err != nil {
		return err
	}
	if _, err := c.w.WriteString("\r\n"); err != nil {
		return err
	}
	return c.w.Flush()
}

// arm gives the next read or write the connection's timeout.
func (c *lineConn) arm() { armDeadline(c.ctx, c.conn, c.timeout) }
