package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// IMAPClient is the client side of one IMAP session, for tools that drive
// a server command by command and must know what each command's outcome
// was (the robustness harness in e2e): one command at a time, every
// response bounded in size, every read and write within the timeout, and
// all I/O failing at once when the context given to DialIMAP ends. It
// speaks the syntax IMAP4rev1 and IMAP4rev2 share and sends literals only
// as LITERAL+ (RFC 7888), never waiting for a continuation.
type IMAPClient struct {
	conn    net.Conn
	c       *imapConn
	unwatch func() bool
}

// IMAPResponse is one untagged response as read: Lines[0] starts it,
// Literals[i] follows Lines[i] (which ends with the literal's "{n}"), and
// Lines[i+1] continues after it. Lines have no CRLF. It is valid only
// during the callback it is handed to.
type IMAPResponse struct {
	Lines, Literals [][]byte
}

// DialIMAP connects to addr and reads the greeting, which must be OK.
// timeout bounds every read and write; ctx bounds the whole session.
func DialIMAP(ctx context.Context, d Dialer, addr string, timeout time.Duration) (*IMAPClient, error) {
	if d == nil {
		d = &net.Dialer{Timeout: timeout}
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("imap dial: %w", err)
	}
	c := &IMAPClient{conn: conn, c: newIMAPConn(newLineConn(ctx, conn, timeout)), unwatch: watch(ctx, conn)}
	c.c.arm()
	greet, err := c.c.ir.read(maxIMAPEnvelope)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("imap greeting: %w", err)
	}
	if g := greet.lines[0]; !hasPrefixFold(g, "* OK") {
		c.Close()
		return nil, fmt.Errorf("%w: imap greeting %q", ErrProtocol, g)
	}
	return c, nil
}

// Close ends the connection without LOGOUT.
func (c *IMAPClient) Close() error {
	c.unwatch()
	return c.conn.Close()
}

// Login authenticates with LOGIN (RFC 9051 section 6.2.3).
func (c *IMAPClient) Login(user, password string) error {
	u, err := imapQuote(user)
	if err != nil {
		return err
	}
	p, err := imapQuote(password)
	if err != nil {
		return err
	}
	_, err = c.c.cmdText("LOGIN "+u+" "+p, maxIMAPEnvelope, nil)
	return err
}

// Command sends line as one tagged command and hands every untagged
// response to fn (nil discards them), each bounded by max octets. It
// returns the text of the tagged OK, response code included ("[COPYUID 7
// 1 4] ..."). A tagged NO or BAD is an *IMAPStatusError; any other error
// leaves the session unusable.
func (c *IMAPClient) Command(line string, max int, fn func(*IMAPResponse) error) (string, error) {
	return c.c.cmdText(line, max, wrap(fn))
}

// Append sends "APPEND mailbox {n+}" and msg as a non-synchronising
// literal (RFC 7888), and returns the tagged OK's text ("[APPENDUID v u]
// ..."). mailbox must be an atom or a quoted string.
func (c *IMAPClient) Append(mailbox string, msg []byte, max int, fn func(*IMAPResponse) error) (string, error) {
	c.c.tag++
	tag := "a" + strconv.Itoa(c.c.tag)
	c.c.arm()
	w := c.c.w
	_, _ = w.WriteString(tag + " APPEND " + mailbox + " {" + strconv.Itoa(len(msg)) + "+}\r\n")
	_, _ = w.Write(msg)
	_, _ = w.WriteString("\r\n")
	if err := w.Flush(); err != nil {
		return "", err
	}
	return c.c.untilTagged(tag, max, wrap(fn))
}

// Idle runs IDLE (RFC 2177): it waits for the continuation, then hands
// each untagged response to fn until fn returns true or wait has passed,
// then sends DONE and reads up to the tagged OK, whose text it returns.
// A deadline that falls inside a response loses it: the session then
// fails at its next read.
func (c *IMAPClient) Idle(wait time.Duration, max int, fn func(*IMAPResponse) (bool, error)) (string, error) {
	c.c.tag++
	tag := "a" + strconv.Itoa(c.c.tag)
	if err := c.c.writeLine(tag + " IDLE"); err != nil {
		return "", err
	}
	for {
		c.c.arm()
		r, err := c.c.ir.read(max)
		if err != nil {
			return "", err
		}
		first := r.lines[0]
		if len(first) > 0 && first[0] == '+' {
			break
		}
		if len(first) < 2 || first[0] != '*' {
			return "", fmt.Errorf("%w: IDLE: unexpected response %q", ErrProtocol, first)
		}
		if _, err := fn(exported(r)); err != nil {
			return "", err
		}
	}
	end := time.Now().Add(wait)
	for {
		armDeadline(c.c.ctx, c.conn, time.Until(end))
		r, err := c.c.ir.read(max)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && c.c.ctx.Err() == nil && !time.Now().Before(end) {
			break
		}
		if err != nil {
			return "", err
		}
		first := r.lines[0]
		if len(first) < 2 || first[0] != '*' {
			return "", fmt.Errorf("%w: IDLE: unexpected response %q", ErrProtocol, first)
		}
		stop, err := fn(exported(r))
		if err != nil {
			return "", err
		}
		if stop {
			break
		}
	}
	if err := c.c.writeLine("DONE"); err != nil {
		return "", err
	}
	return c.c.untilTagged(tag, max, func(r *imapResponse) error {
		_, err := fn(exported(r))
		return err
	})
}

func exported(r *imapResponse) *IMAPResponse {
	return &IMAPResponse{Lines: r.lines, Literals: r.lits}
}

func wrap(fn func(*IMAPResponse) error) func(*imapResponse) error {
	if fn == nil {
		return nil
	}
	return func(r *imapResponse) error { return fn(exported(r)) }
}
