package loadgen

import (
	"bufio"
	"errors"
	"fmt"
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
