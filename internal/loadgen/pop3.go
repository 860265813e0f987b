package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// POP3Options describe a mailbox to retrieve.
type POP3Options struct {
	Addr     string // host:port of a plaintext POP3 listener
	User     string
	Password string
	Dialer   Dialer        // default a net.Dialer
	Timeout  time.Duration // bounds every reply; default 60s
	// MaxMessageSize bounds one retrieved message; default 64 MiB.
	MaxMessageSize int
}

// POP3 limits: RFC 1939 section 3 caps a response line at 512 octets; a
// message line may be as long as the server stored it, and RFC 5322
// section 2.1.1 caps that at 998 octets, which we exceed generously.
const (
	maxPOP3Status  = 2048
	maxMessageLine = 64 << 10
)

// FetchPOP3 logs in with USER/PASS (RFC 1939 section 7) and calls fn with
// every message of the maildrop, in order, as stored: the RETR response
// with its dot-stuffing removed and CRLF line ends. msg is valid only
// during the call. It deletes nothing. An error from fn stops the
// retrieval and is returned.
func FetchPOP3(ctx context.Context, o POP3Options, fn func(n int, msg []byte) error) (err error) {
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Dialer == nil {
		o.Dialer = &net.Dialer{Timeout: o.Timeout}
	}
	if o.MaxMessageSize <= 0 {
		o.MaxMessageSize = 64 << 20
	}
	conn, err := o.Dialer.DialContext(ctx, "tcp", o.Addr)
	if err != nil {
		return fmt.Errorf("pop3: %w", err)
	}
	defer conn.Close()
	defer watch(ctx, conn)()
	p := &pop3Conn{newLineConn(ctx, conn, o.Timeout)}

	if _, err := p.status(); err != nil {
		return fmt.Errorf("pop3: greeting: %w", err)
	}
	if _, err := p.cmd("USER " + o.User); err != nil {
		return fmt.Errorf("pop3: USER: %w", err)
	}
	if _, err := p.cmd("PASS " + o.Password); err != nil {
		return fmt.Errorf("pop3: PASS: %w", err)
	}
	stat, err := p.cmd("STAT")
	if err != nil {
		return fmt.Errorf("pop3: STAT: %w", err)
	}
	count, err := parseStat(stat)
	if err != nil {
		return err
	}
	var msg []byte
	for i := 1; i <= count; i++ {
		if _, err := p.cmd("RETR " + strconv.Itoa(i)); err != nil {
			return fmt.Errorf("pop3: RETR %d: %w", i, err)
		}
		msg, err = readMultiline(p.r, msg[:0], o.MaxMessageSize)
		if err != nil {
			return fmt.Errorf("pop3: RETR %d: %w", i, err)
		}
		if err := fn(i, msg); err != nil {
			return err
		}
	}
	if _, err := p.cmd("QUIT"); err != nil {
		return fmt.Errorf("pop3: QUIT: %w", err)
	}
	return nil
}

// pop3Conn is the client side of a POP3 session.
type pop3Conn struct{ *lineConn }

// cmd sends one command and returns the text after "+OK".
func (p *pop3Conn) cmd(line string) (string, error) {
	if err := p.writeLine(line); err != nil {
		return "", err
	}
	return p.status()
}

// pipelining asks for the server's capabilities (RFC 2449 section 5) and
// reports whether they include PIPELINING. A -ERR, from a server without
// CAPA, means no.
func (p *pop3Conn) pipelining() bool {
	if _, err := p.cmd("CAPA"); err != nil {
		return false
	}
	capa, err := readMultiline(p.r, nil, maxPOP3Status*64)
	if err != nil {
		return false
	}
	for line := range bytes.SplitSeq(capa, []byte("\r\n")) {
		if name, _, _ := bytes.Cut(line, []byte(" ")); string(bytes.ToUpper(name)) == "PIPELINING" {
			return true
		}
	}
	return false
}

// pipeline sends commands cmd(0) to cmd(n-1) and hands each +OK reply's
// text, in order, to reply, which reads any multi-line body that follows.
// Up to window commands go out in one write ahead of their replies; a
// window of 1 is the lock-step of RFC 1939. The first -ERR or error from
// reply stops it, labelled with the command's verb; commands already sent
// after it are left unanswered, so the caller must end the session.
func (p *pop3Conn) pipeline(n, window int, cmd func(k int) string, reply func(k int, status string) error) error {
	sent := 0
	for k := 0; k < n; k++ {
		if sent == k {
			p.arm()
			for ; sent < n && sent < k+window; sent++ {
				p.w.WriteString(cmd(sent))
				p.w.WriteString("\r\n")
			}
			if err := p.w.Flush(); err != nil {
				return fmt.Errorf("pop3 %s: %w", verb(cmd(k)), err)
			}
		}
		status, err := p.status()
		if err == nil {
			err = reply(k, status)
		}
		if err != nil {
			return fmt.Errorf("pop3 %s: %w", verb(cmd(k)), err)
		}
	}
	return nil
}

// verb is a command line's first word, for errors: never its arguments,
// which may be a password.
func verb(line string) string {
	v, _, _ := strings.Cut(line, " ")
	return v
}

func (p *pop3Conn) status() (string, error) {
	p.arm()
	line, err := readLine(p.r, maxPOP3Status)
	if err != nil {
		return "", err
	}
	switch {
	case bytes.HasPrefix(line, []byte("+OK")):
		return string(bytes.TrimPrefix(line[3:], []byte(" "))), nil
	case bytes.HasPrefix(line, []byte("-ERR")):
		return "", fmt.Errorf("server said %q", line)
	}
	return "", fmt.Errorf("%w: bad POP3 status line %q", ErrProtocol, line)
}

// parseStat parses the STAT reply "nn mm" (RFC 1939 section 5).
func parseStat(s string) (int, error) {
	f := bytes.Fields([]byte(s))
	if len(f) < 2 {
		return 0, fmt.Errorf("%w: bad STAT reply %q", ErrProtocol, s)
	}
	n, err := strconv.Atoi(string(f[0]))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: bad STAT reply %q", ErrProtocol, s)
	}
	return n, nil
}

// readMultiline reads a multi-line response body up to its "." line
// (RFC 1939 section 3), removes the byte-stuffing, appends the content to
// dst with CRLF line ends and returns it. The content may not exceed max
// octets; lines may not exceed maxMessageLine.
func readMultiline(r *bufio.Reader, dst []byte, max int) ([]byte, error) {
	start := len(dst)
	for {
		line, err := readLine(r, maxMessageLine+2)
		if err != nil {
			return dst, err
		}
		if len(line) > 0 && line[0] == '.' {
			if len(line) == 1 {
				return dst, nil
			}
			line = line[1:]
		}
		if len(dst)-start+len(line)+2 > max {
			return dst, fmt.Errorf("%w: message larger than %d octets", ErrProtocol, max)
		}
		dst = append(dst, line...)
		dst = append(dst, '\r', '\n')
	}
}
