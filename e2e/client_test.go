package e2e

// Minimal SMTP and POP3 clients for checking server state from Go. They are
// deliberately small and strict: every read is bounded in length and in
// time, and they implement only what the tests use. The real-client tests
// (Python, swaks, fetchmail, Postfix) exercise the protocols; these only
// observe.

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	maxLine      = 8 << 10  // longest reply line accepted (RFC 5321 allows 512; POP3 512)
	maxReplyRows = 100      // longest multi-line SMTP reply
	maxMultiline = 32 << 20 // largest POP3 multi-line response (RETR, LIST)
	ioTimeout    = 30 * time.Second
)

// textConn is a CRLF line connection with bounded reads; every exchange
// sets a fresh deadline, ioTimeout from now, or the connection's fixed
// deadline when it has one (dialTextUntil).
type textConn struct {
	conn     net.Conn
	br       *bufio.Reader
	deadline time.Time // zero: ioTimeout per exchange
}

func dialText(addr string) (*textConn, error) {
	return dialTextUntil(addr, time.Time{})
}

// dialTextUntil connects with a deadline for the whole session: every
// exchange must end before it (the zero time means ioTimeout per
// exchange).
func dialTextUntil(addr string, deadline time.Time) (*textConn, error) {
	timeout := ioTimeout
	if !deadline.IsZero() {
		timeout = time.Until(deadline)
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &textConn{conn: c, br: bufio.NewReaderSize(c, maxLine), deadline: deadline}, nil
}

// arm sets the deadline of the next exchange.
func (c *textConn) arm() {
	if !c.deadline.IsZero() {
		_ = c.conn.SetDeadline(c.deadline)
		return
	}
	_ = c.conn.SetDeadline(time.Now().Add(ioTimeout))
}

// dialTLS connects with implicit TLS, skipping verification (the server's
// certificate is self-signed).
func dialTLS(addr string) (*textConn, error) {
	d := &net.Dialer{Timeout: ioTimeout}
	c, err := tls.DialWithDialer(d, "tcp", addr, insecureTLS())
	if err != nil {
		return nil, err
	}
	return &textConn{conn: c, br: bufio.NewReaderSize(c, maxLine)}, nil
}

func insecureTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
}

// startTLS upgrades the connection after a STARTTLS/STLS go-ahead. Bytes
// the server sent before the handshake would be a STARTTLS injection bug:
// they are reported as an error.
func (c *textConn) startTLS() error {
	if c.br.Buffered() > 0 {
		return fmt.Errorf("server sent %d bytes before the TLS handshake", c.br.Buffered())
	}
	tc := tls.Client(c.conn, insecureTLS())
	_ = tc.SetDeadline(time.Now().Add(ioTimeout))
	if err := tc.Handshake(); err != nil {
		return err
	}
	c.conn = tc
	c.br = bufio.NewReaderSize(tc, maxLine)
	return nil
}

func (c *textConn) Close() error { return c.conn.Close() }

func (c *textConn) writeLine(line string) error {
	c.arm()
	_, err := c.conn.Write([]byte(line + "\r\n"))
	return err
}

// readLine returns one line without its CRLF; a line longer than maxLine is
// an error, not a partial read.
func (c *textConn) readLine() (string, error) {
	c.arm()
	line, err := c.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return "", fmt.Errorf("reply line longer than %d bytes", maxLine)
	}
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(line), "\r\n"), nil
}

// SMTPError is a reply the client did not expect.
type SMTPError struct {
	Cmd  string
	Code int
	Text string // the reply text, lines joined by "\n"
}

func (e *SMTPError) Error() string {
	return fmt.Sprintf("%s: %d %s", e.Cmd, e.Code, e.Text)
}

// readReply reads one SMTP reply (RFC 5321 section 4.2), multi-line included.
func (c *textConn) readReply() (int, string, error) {
	var text []string
	code := 0
	for i := 0; i < maxReplyRows; i++ {
		line, err := c.readLine()
		if err != nil {
			return 0, "", err
		}
		if len(line) < 3 {
			return 0, "", fmt.Errorf("malformed reply line %q", line)
		}
		n, err := strconv.Atoi(line[:3])
		if err != nil || n < 200 || n > 599 {
			return 0, "", fmt.Errorf("malformed reply line %q", line)
		}
		if code != 0 && n != code {
			return 0, "", fmt.Errorf("reply code changed mid-reply: %q", line)
		}
		code = n
		if len(line) > 4 {
			text = append(text, line[4:])
		} else {
			text = append(text, "")
		}
		if len(line) == 3 || line[3] == ' ' {
			return code, strings.Join(text, "\n"), nil
		}
		if line[3] != '-' {
			return 0, "", fmt.Errorf("malformed reply line %q", line)
		}
	}
	return 0, "", fmt.Errorf("reply longer than %d lines", maxReplyRows)
}

// smtpCmd sends line (unless empty) and expects a reply with code want.
func (c *textConn) smtpCmd(line string, want int) (string, error) {
	if line != "" {
		if err := c.writeLine(line); err != nil {
			return "", err
		}
	}
	code, text, err := c.readReply()
	if err != nil {
		return "", fmt.Errorf("%s: %w", line, err)
	}
	if code != want {
		name := line
		if name == "" {
			name = "greeting"
		}
		return text, &SMTPError{Cmd: name, Code: code, Text: text}
	}
	return text, nil
}

// smtpSend delivers msg (CRLF lines) over plain SMTP or LMTP without TLS
// or AUTH: the MX or LMTP listener. It returns an *SMTPError for the first
// rejected command. With lmtp, one reply per recipient follows the data
// (RFC 2033 section 4.2) and every one must be 250.
func smtpSend(addr string, lmtp bool, from string, to []string, msg []byte) error {
	r := smtpTransaction(addr, time.Time{}, lmtp, from, to, msg)
	if r.Err != nil {
		return r.Err
	}
	for i, code := range r.Final {
		if code != 250 {
			return &SMTPError{Cmd: "end of data", Code: code, Text: r.FinalText[i]}
		}
	}
	return nil
}

// smtpOutcome is what one SMTP or LMTP transaction established, in the
// detail a history needs: which recipients were accepted, the replies to
// the end of the data (one for SMTP, one per accepted recipient for
// LMTP, in order; 0 where none came), and whether the data's final "."
// was sent, after which a missing reply leaves the outcome unknown.
type smtpOutcome struct {
	Accepted  []bool
	Final     []int
	FinalText []string
	DataSent  bool
	Err       error // the first refusal (*SMTPError) or I/O error
}

// smtpTransaction runs one transaction on a new connection; with a
// non-zero deadline the whole session must end before it.
func smtpTransaction(addr string, deadline time.Time, lmtp bool, from string, to []string, msg []byte) (r smtpOutcome) {
	r.Accepted = make([]bool, len(to))
	c, err := dialTextUntil(addr, deadline)
	if err != nil {
		r.Err = err
		return r
	}
	defer c.Close()
	if _, r.Err = c.smtpCmd("", 220); r.Err != nil {
		return r
	}
	hello := "EHLO client.e2e.test"
	if lmtp {
		hello = "LHLO client.e2e.test"
	}
	if _, r.Err = c.smtpCmd(hello, 250); r.Err != nil {
		return r
	}
	if _, r.Err = c.smtpCmd("MAIL FROM:<"+from+">", 250); r.Err != nil {
		return r
	}
	var accepted []int
	for i, rcpt := range to {
		if _, err := c.smtpCmd("RCPT TO:<"+rcpt+">", 250); err != nil {
			var se *SMTPError
			if !errors.As(err, &se) {
				r.Err = err
				return r
			}
			if r.Err == nil {
				r.Err = err
			}
			continue
		}
		r.Accepted[i] = true
		accepted = append(accepted, i)
	}
	if len(accepted) == 0 {
		return r
	}
	if _, err := c.smtpCmd("DATA", 354); err != nil {
		r.Err = err
		return r
	}
	c.arm()
	if _, err := c.conn.Write(append(dotStuff(msg), ".\r\n"...)); err != nil {
		// Part of the data may have reached the server, never its end.
		r.Err = err
		return r
	}
	r.DataSent = true
	replies := 1
	if lmtp {
		replies = len(accepted)
	}
	r.Final, r.FinalText = make([]int, replies), make([]string, replies)
	for i := 0; i < replies; i++ {
		code, text, err := c.readReply()
		if err != nil {
			r.Err = fmt.Errorf("end of data: %w", err)
			return r
		}
		r.Final[i], r.FinalText[i] = code, text
	}
	_, _ = c.smtpCmd("QUIT", 221)
	return r
}

// dotStuff applies RFC 5321 section 4.5.2 transparency and makes sure msg
// ends in CRLF.
func dotStuff(msg []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.SplitAfter(msg, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if line[0] == '.' {
			b.WriteByte('.')
		}
		b.Write(line)
	}
	if !bytes.HasSuffix(b.Bytes(), []byte("\r\n")) {
		b.WriteString("\r\n")
	}
	return b.Bytes()
}

// POP3Client is a POP3 session in the TRANSACTION state (RFC 1939).
type POP3Client struct {
	c *textConn
}

// POP3Error is a -ERR response; Text is what followed "-ERR ".
type POP3Error struct {
	Cmd  string
	Text string
}

func (e *POP3Error) Error() string { return fmt.Sprintf("%s: -ERR %s", e.Cmd, e.Text) }

// dialPOP3 logs in with USER/PASS over a plain connection (allowed from
// loopback). It returns an error (a *POP3Error for -ERR) rather than
// failing the test so that callers can check refusals such as [IN-USE].
func dialPOP3(addr, user, pass string) (*POP3Client, error) {
	c, err := dialText(addr)
	if err != nil {
		return nil, err
	}
	p := &POP3Client{c: c}
	if _, err := p.cmd(""); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := p.cmd("USER " + user); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := p.cmd("PASS " + pass); err != nil {
		c.Close()
		return nil, err
	}
	return p, nil
}

// cmd sends line (unless empty: the greeting) and returns the text after
// "+OK".
func (p *POP3Client) cmd(line string) (string, error) {
	if line != "" {
		if err := p.c.writeLine(line); err != nil {
			return "", err
		}
	}
	resp, err := p.c.readLine()
	if err != nil {
		return "", err
	}
	name := line
	if strings.HasPrefix(name, "PASS ") {
		name = "PASS"
	}
	switch {
	case resp == "+OK" || strings.HasPrefix(resp, "+OK "):
		return strings.TrimPrefix(strings.TrimPrefix(resp, "+OK"), " "), nil
	case resp == "-ERR" || strings.HasPrefix(resp, "-ERR "):
		return "", &POP3Error{Cmd: name, Text: strings.TrimPrefix(strings.TrimPrefix(resp, "-ERR"), " ")}
	default:
		return "", fmt.Errorf("%s: malformed response %q", name, resp)
	}
}

// multi sends a command with a multi-line response and returns its body
// with dot-stuffing removed and CRLF line ends (RFC 1939 section 3).
func (p *POP3Client) multi(line string) ([]byte, error) {
	if _, err := p.cmd(line); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for {
		l, err := p.c.readLine()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", line, err)
		}
		if l == "." {
			return b.Bytes(), nil
		}
		if strings.HasPrefix(l, ".") {
			l = l[1:]
		}
		if b.Len()+len(l)+2 > maxMultiline {
			return nil, fmt.Errorf("%s: response longer than %d bytes", line, maxMultiline)
		}
		b.WriteString(l)
		b.WriteString("\r\n")
	}
}

// Stat returns the message count and total size.
func (p *POP3Client) Stat() (int, int64, error) {
	resp, err := p.cmd("STAT")
	if err != nil {
		return 0, 0, err
	}
	var n int
	var size int64
	if _, err := fmt.Sscanf(resp, "%d %d", &n, &size); err != nil {
		return 0, 0, fmt.Errorf("STAT: malformed %q", resp)
	}
	return n, size, nil
}

// Retr returns message i (1-based) as the server stores it.
func (p *POP3Client) Retr(i int) ([]byte, error) { return p.multi(fmt.Sprintf("RETR %d", i)) }

// Quit ends the session, committing deletions (the UPDATE state).
func (p *POP3Client) Quit() error {
	defer p.c.Close()
	_, err := p.cmd("QUIT")
	return err
}

// Close drops the connection without QUIT: no deletion takes effect.
func (p *POP3Client) Close() error { return p.c.Close() }

// fetchAll logs in, retrieves every message without deleting any, and
// quits. It returns an error rather than failing so that it can serve as
// an eventually condition.
func fetchAll(addr, user, pass string) ([][]byte, error) {
	p, err := dialPOP3(addr, user, pass)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	n, _, err := p.Stat()
	if err != nil {
		return nil, err
	}
	msgs := make([][]byte, 0, n)
	for i := 1; i <= n; i++ {
		m, err := p.Retr(i)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, p.Quit()
}

// mustFetchAll is fetchAll that fails the test on error.
func mustFetchAll(t testing.TB, addr, user, pass string) [][]byte {
	t.Helper()
	msgs, err := fetchAll(addr, user, pass)
	if err != nil {
		t.Fatalf("POP3 fetch for %s: %v", user, err)
	}
	return msgs
}

// token returns a random hex string that marks one test message.
func token() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// testMessage returns an RFC 5322 message with CRLF line ends whose body
// carries tok and exercises transparency (lines that start with a dot).
func testMessage(from, to, subject, tok string) []byte {
	lines := []string{
		"From: <" + from + ">",
		"To: <" + to + ">",
		"Subject: " + subject,
		"Date: Mon, 02 Jan 2006 15:04:05 +0000",
		"Message-ID: <" + tok + "@e2e.test>",
		"MIME-Version: 1.0",
		"Content-Type: text/plain; charset=us-ascii",
		"",
		"token " + tok,
		".a line that starts with a dot",
		"..and one with two",
		"",
		"the end",
	}
	return []byte(strings.Join(lines, "\r\n") + "\r\n")
}

// checkDelivered verifies that got is want as delivered: want unchanged at
// the end, preceded only by header fields the server prepended (trace
// fields such as Return-Path and Received).
func checkDelivered(got, want []byte) error {
	if !bytes.HasSuffix(got, want) {
		return fmt.Errorf("stored message does not end with the sent message\n--- got ---\n%s\n--- want suffix ---\n%s", got, want)
	}
	prefix := got[:len(got)-len(want)]
	for _, line := range bytes.SplitAfter(prefix, []byte("\r\n")) {
		if len(line) == 0 {
			continue
		}
		if !bytes.HasSuffix(line, []byte("\r\n")) {
			return fmt.Errorf("prepended text %q is not CRLF-terminated", line)
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue // folded continuation
		}
		if i := bytes.IndexByte(line, ':'); i <= 0 {
			return fmt.Errorf("prepended line %q is not a header field", line)
		}
	}
	return nil
}

// findToken returns the messages among msgs that contain tok.
func findToken(msgs [][]byte, tok string) [][]byte {
	var out [][]byte
	for _, m := range msgs {
		if bytes.Contains(m, []byte(tok)) {
			out = append(out, m)
		}
	}
	return out
}
