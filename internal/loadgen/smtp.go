package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Dialer opens connections; *net.Dialer satisfies it.
type Dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// Outcome is what the client learned about one message.
type Outcome uint8

const (
	// Acked: the server answered the end of data with 2xx (RFC 5321
	// section 4.1.1.4): it has taken responsibility for the message.
	Acked Outcome = iota + 1
	// Rejected: the server refused the transaction with a 4xx or 5xx reply.
	Rejected
	// NoReply: the connection failed or timed out before the final reply;
	// the message may or may not have been stored.
	NoReply
)

func (o Outcome) String() string {
	switch o {
	case Acked:
		return "acked"
	case Rejected:
		return "rejected"
	case NoReply:
		return "noreply"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Stage is how far a transaction got; for a NoReply message it tells where
// the connection failed.
type Stage uint8

const (
	// StageCommands: RSET, MAIL, RCPT, DATA and their replies.
	StageCommands Stage = iota
	// StageBody: sending the message content after 354.
	StageBody
	// StageFinalReply: the content was sent; waiting for the final reply.
	StageFinalReply
	// StageDone: the final reply was read.
	StageDone
)

func (s Stage) String() string {
	switch s {
	case StageCommands:
		return "commands"
	case StageBody:
		return "body"
	case StageFinalReply:
		return "final-reply"
	case StageDone:
		return "done"
	}
	return "stage(" + strconv.Itoa(int(s)) + ")"
}

// smtpClient is one SMTP session used for one or more transactions. It is
// owned by a single worker goroutine.
type smtpClient struct {
	ctx     context.Context // the run's; cancelling it fails blocked I/O
	conn    net.Conn
	r       *bufio.Reader
	w       *bufio.Writer
	timeout time.Duration
	stop    func() bool // unregisters the context watcher

	pipelining bool
	sizeExt    bool
	// dirty: the previous transaction ended without a final reply to DATA,
	// so the server may still hold a reverse-path; RSET comes first.
	dirty bool
	// broken: the session can no longer be used (I/O error, 421).
	broken bool
	// sent counts the transactions run on the session, for the owner's
	// messages-per-connection bound.
	sent int

	stage    Stage  // of the current transaction
	accepted []bool // per recipient of the current transaction
	cmd      []byte // the current command group
	ends     []int  // end offset of each command line in cmd
	codes    []int  // reply codes of the current command group
}

// dialSMTP connects, reads the greeting and sends EHLO. Cancelling ctx at
// any time (also after dialSMTP returns) aborts blocked I/O on the session.
func dialSMTP(ctx context.Context, d Dialer, addr, helo string, timeout time.Duration) (*smtpClient, error) {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &smtpClient{
		ctx:     ctx,
		conn:    conn,
		r:       bufio.NewReaderSize(conn, 4096),
		w:       bufio.NewWriterSize(conn, 32<<10),
		timeout: timeout,
	}
	c.stop = watch(ctx, conn)
	if err := c.greet(helo); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *smtpClient) deadline() { armDeadline(c.ctx, c.conn, c.timeout) }

// expired is a deadline in the past: it fails blocked and future I/O.
var expired = time.Unix(1, 0)

// watch makes cancelling ctx fail conn's blocked I/O; the returned function
// unregisters it. Use armDeadline, never SetDeadline, afterwards.
func watch(ctx context.Context, conn net.Conn) func() bool {
	return context.AfterFunc(ctx, func() { _ = conn.SetDeadline(expired) })
}

// armDeadline gives conn's next I/O d to complete, unless ctx is done. The
// re-check after arming closes the race with watch's callback: ctx.Err is
// set before that callback runs, so either the callback runs after the
// re-check and expires the deadline, or the re-check sees the cancellation.
func armDeadline(ctx context.Context, conn net.Conn, d time.Duration) {
	_ = conn.SetDeadline(time.Now().Add(d))
	if ctx.Err() != nil {
		_ = conn.SetDeadline(expired)
	}
}

func (c *smtpClient) greet(helo string) error {
	c.deadline()
	code, text, err := readReply(c.r, nil)
	if err != nil {
		return fmt.Errorf("greeting: %w", err)
	}
	if code != 220 {
		return &ReplyError{Command: "greeting", Code: code, Text: string(text)}
	}
	if _, err := fmt.Fprintf(c.w, "EHLO %s\r\n", helo); err != nil {
		return err
	}
	if err := c.w.Flush(); err != nil {
		return err
	}
	var lines []string
	code, text, err = readReply(c.r, &lines)
	if err != nil {
		return fmt.Errorf("EHLO: %w", err)
	}
	if code != 250 {
		return &ReplyError{Command: "EHLO", Code: code, Text: string(text)}
	}
	for _, l := range lines[1:] { // the first line is the greeting domain
		kw, _, _ := strings.Cut(l, " ")
		switch strings.ToUpper(kw) {
		case "PIPELINING": // RFC 2920
			c.pipelining = true
		case "SIZE": // RFC 1870
			c.sizeExt = true
		}
	}
	return nil
}

// ReplyError is an unexpected reply outside a mail transaction.
type ReplyError struct {
	Command string
	Code    int
	Text    string
}

func (e *ReplyError) Error() string {
	return fmt.Sprintf("loadgen: %s: server replied %d %s", e.Command, e.Code, e.Text)
}

// txResult is the outcome of one transaction. accepted is the client's
// buffer, valid until the next transaction.
type txResult struct {
	outcome  Outcome
	code     int
	accepted []bool
	stage    Stage
	err      error
}

// send runs one mail transaction for m. With PIPELINING (RFC 2920 section
// 3.1) RSET, MAIL, every RCPT and DATA go out in one write and their replies
// are read afterwards; the message itself follows only a 354.
func (c *smtpClient) send(m *Message, from string) txResult {
	c.accepted = c.accepted[:0]
	for range m.Rcpts {
		c.accepted = append(c.accepted, false)
	}
	c.stage = StageCommands
	res, err := c.transact(m, from)
	res.accepted = c.accepted
	res.stage = c.stage
	if err != nil {
		c.broken = true
		return txResult{outcome: NoReply, err: err, accepted: c.accepted, stage: c.stage}
	}
	if res.code == 421 { // RFC 5321 section 3.8: the server is closing
		c.broken = true
	}
	return res
}

func (c *smtpClient) transact(m *Message, from string) (txResult, error) {
	c.deadline()
	rset := c.dirty
	c.dirty = true // until the final reply to DATA proves otherwise

	// The command group: [RSET] MAIL RCPT... DATA, each line in c.cmd.
	c.cmd = c.cmd[:0]
	c.ends = c.ends[:0]
	if rset {
		c.cmd = append(c.cmd, "RSET\r\n"...)
		c.ends = append(c.ends, len(c.cmd))
	}
	c.cmd = append(c.cmd, "MAIL FROM:<"...)
	c.cmd = append(c.cmd, from...)
	c.cmd = append(c.cmd, '>')
	if c.sizeExt {
		c.cmd = append(c.cmd, " SIZE="...)
		c.cmd = strconv.AppendInt(c.cmd, int64(len(m.Data)), 10)
	}
	c.cmd = append(c.cmd, "\r\n"...)
	c.ends = append(c.ends, len(c.cmd))
	for _, r := range m.Rcpts {
		c.cmd = append(c.cmd, "RCPT TO:<"...)
		c.cmd = append(c.cmd, r...)
		c.cmd = append(c.cmd, ">\r\n"...)
		c.ends = append(c.ends, len(c.cmd))
	}
	c.cmd = append(c.cmd, "DATA\r\n"...)
	c.ends = append(c.ends, len(c.cmd))

	codes, err := c.exchange()
	if err != nil {
		return txResult{}, err
	}
	if rset {
		if codes[0] != 250 {
			return txResult{outcome: Rejected, code: codes[0]}, nil
		}
		codes = codes[1:]
	}
	mailCode, rcptCodes, dataCode := codes[0], codes[1:len(codes)-1], codes[len(codes)-1]
	rcptCode, nAccepted := 0, 0
	for i, code := range rcptCodes {
		if code/100 == 2 {
			c.accepted[i] = true
			nAccepted++
		} else {
			rcptCode = code
		}
	}

	decided := 0 // the reply that refused the transaction, if any
	switch {
	case mailCode/100 != 2:
		decided = mailCode
	case nAccepted == 0:
		decided = rcptCode
	case dataCode != 354:
		decided = dataCode
	}
	if dataCode != 354 {
		return txResult{outcome: Rejected, code: decided}, nil
	}
	if decided != 0 {
		// A server that says 354 without a valid recipient is wrong
		// (RFC 2920 section 3.1), but the data phase must still end.
		if _, err := c.w.WriteString(".\r\n"); err != nil {
			return txResult{}, err
		}
	} else {
		c.stage = StageBody
		if err := writeDotStuffed(c.w, m.Data); err != nil {
			return txResult{}, err
		}
	}
	if err := c.w.Flush(); err != nil {
		return txResult{}, err
	}
	c.stage = StageFinalReply
	c.deadline() // a large body may have used up the previous deadline
	final, err := c.readCode("end of data")
	if err != nil {
		return txResult{}, err
	}
	c.stage = StageDone
	c.dirty = false // RFC 5321 section 4.1.1.4: the transaction is over
	if decided != 0 {
		return txResult{outcome: Rejected, code: decided}, nil
	}
	if final/100 == 2 {
		return txResult{outcome: Acked, code: final}, nil
	}
	return txResult{outcome: Rejected, code: final}, nil
}

// exchange sends the command lines in c.cmd (delimited by c.ends) and
// returns their reply codes in order: all in one write when the server
// pipelines, otherwise one command and reply at a time.
func (c *smtpClient) exchange() ([]int, error) {
	c.codes = c.codes[:0]
	start := 0
	for _, end := range c.ends {
		if _, err := c.w.Write(c.cmd[start:end]); err != nil {
			return nil, err
		}
		start = end
		if c.pipelining {
			continue
		}
		if err := c.w.Flush(); err != nil {
			return nil, err
		}
		code, err := c.readCode("command")
		if err != nil {
			return nil, err
		}
		c.codes = append(c.codes, code)
	}
	if c.pipelining {
		if err := c.w.Flush(); err != nil {
			return nil, err
		}
		for range c.ends {
			code, err := c.readCode("pipelined command")
			if err != nil {
				return nil, err
			}
			c.codes = append(c.codes, code)
		}
	}
	return c.codes, nil
}

func (c *smtpClient) readCode(cmd string) (int, error) {
	code, _, err := readReply(c.r, nil)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", cmd, err)
	}
	return code, nil
}

// writeDotStuffed writes data, which must end in CRLF, as SMTP DATA content
// (RFC 5321 section 4.5.2): a '.' is prepended to every line that starts
// with '.', and the terminating ".\r\n" is appended.
func writeDotStuffed(w *bufio.Writer, data []byte) error {
	if len(data) > 0 && data[0] == '.' {
		if err := w.WriteByte('.'); err != nil {
			return err
		}
	}
	for len(data) > 0 {
		i := bytes.Index(data, []byte("\n."))
		if i < 0 {
			break
		}
		if _, err := w.Write(data[:i+1]); err != nil {
			return err
		}
		if err := w.WriteByte('.'); err != nil {
			return err
		}
		data = data[i+1:]
	}
	if _, err := w.Write(data); err != nil {
		return err
	}
	_, err := w.WriteString(".\r\n")
	return err
}

// quit ends the session politely; errors are irrelevant at this point.
func (c *smtpClient) quit() {
	if !c.broken {
		c.deadline()
		if _, err := c.w.WriteString("QUIT\r\n"); err == nil && c.w.Flush() == nil {
			_, _, _ = readReply(c.r, nil)
		}
	}
	c.close()
}

func (c *smtpClient) close() {
	c.stop()
	_ = c.conn.Close()
}

// isTimeout reports whether err is a deadline or timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
