package pop3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"quill/internal/mailbox"
)

// copyBufSize is the RETR/TOP copy buffer and the size the connection's
// output buffer grows to at the first retrieval: large enough that a 1 MB
// message takes few storage reads and that several pipelined responses
// (RFC 2449 section 6.6) share one network write, small enough to keep
// per-session memory low.
const copyBufSize = 32 << 10

// copyBufs recycles the copy buffers of ended sessions: most sessions
// retrieve, and most last one retrieval.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// stat counts the messages not marked deleted and their octets.
func (s *session) stat() (n int, size int64) {
	for i, m := range s.msgs {
		if !s.deleted[i] {
			n++
			size += m.Size
		}
	}
	return n, size
}

// message resolves a message-number argument to a 0-based index of a
// message that is not marked deleted (RFC 1939 section 5).
func (s *session) message(arg string) (int, error) {
	n, ok := parseDecimal(arg)
	if !ok {
		return 0, errSyntax
	}
	if n < 1 || n > len(s.msgs) {
		return 0, errNoSuchMessage
	}
	if s.deleted[n-1] {
		return 0, errDeleted
	}
	return n - 1, nil
}

func (s *session) cmdNoop(ctx context.Context, cmd Command) error {
	if len(cmd.Args) != 0 {
		return errSyntax
	}
	s.writeLine("+OK")
	return nil
}

// cmdStat: RFC 1939 section 5, "+OK nn mm".
func (s *session) cmdStat(ctx context.Context, cmd Command) error {
	if len(cmd.Args) != 0 {
		return errSyntax
	}
	n, size := s.stat()
	s.writef("+OK %d %d", n, size)
	return nil
}

// cmdList: RFC 1939 section 5, scan listings "msg size".
func (s *session) cmdList(ctx context.Context, cmd Command) error {
	return s.listing(cmd, func(m Message) string { return strconv.FormatInt(m.Size, 10) })
}

// cmdUidl: RFC 1939 section 7, unique-id listings "msg uid".
func (s *session) cmdUidl(ctx context.Context, cmd Command) error {
	return s.listing(cmd, func(m Message) string { return m.UID })
}

// listing is LIST and UIDL: with an argument one line, without a
// multi-line listing of the messages not marked deleted.
func (s *session) listing(cmd Command, value func(Message) string) error {
	switch len(cmd.Args) {
	case 0:
		n, size := s.stat()
		s.writef("+OK %d messages (%d octets)", n, size)
		for i, m := range s.msgs {
			if !s.deleted[i] {
				s.writef("%d %s", i+1, value(m))
			}
		}
		s.writeLine(".")
		return nil
	case 1:
		i, err := s.message(cmd.Args[0])
		if err != nil {
			return err
		}
		s.writef("+OK %d %s", i+1, value(s.msgs[i]))
		return nil
	}
	return errSyntax
}

// cmdRetr: RFC 1939 section 5.
func (s *session) cmdRetr(ctx context.Context, cmd Command) error {
	if len(cmd.Args) != 1 {
		return errSyntax
	}
	i, err := s.message(cmd.Args[0])
	if err != nil {
		return err
	}
	return s.send(ctx, i, fmt.Sprintf("+OK %d octets", s.msgs[i].Size), newDotWriter(s.conn))
}

// cmdTop: RFC 1939 section 7, "TOP msg n": the header, the blank line and
// the first n body lines.
func (s *session) cmdTop(ctx context.Context, cmd Command) error {
	if len(cmd.Args) != 2 {
		return errSyntax
	}
	i, err := s.message(cmd.Args[0])
	if err != nil {
		return err
	}
	lines, ok := parseDecimal(cmd.Args[1])
	if !ok {
		return errSyntax
	}
	return s.send(ctx, i, "+OK top of message follows", newTopWriter(s.conn, lines))
}

// send streams message i through w after the status line. Once the status
// line is out the response can no longer become -ERR, so a failure
// mid-message ends the session: the client sees a truncated response, never
// a wrong one.
func (s *session) send(ctx context.Context, i int, status string, w *dotWriter) error {
	rc, err := s.drop.Retrieve(ctx, i)
	if err != nil {
		return fmt.Errorf("pop3: retrieve message %d: %w", i+1, err)
	}
	defer rc.Close()
	if s.copyBuf == nil {
		s.copyBuf = copyBufs.Get().(*[]byte)
		if err := s.conn.GrowWriteBuffer(copyBufSize); err != nil {
			s.log.Debug("pop3: write failed", "err", err)
			return errAbort
		}
	}
	s.writeLine(status)
	_, err = io.CopyBuffer(w, rc, *s.copyBuf)
	if err == nil || errors.Is(err, errTopDone) {
		err = w.Close()
	}
	if err != nil {
		// What was produced goes out: the client sees a truncated
		// response.
		_ = s.conn.Flush()
		s.log.Warn("pop3: sending message failed", "msg", i+1, "err", err)
		return errAbort
	}
	return nil
}

// cmdDele marks a message deleted (RFC 1939 section 5); it is removed only
// at QUIT.
func (s *session) cmdDele(ctx context.Context, cmd Command) error {
	if len(cmd.Args) != 1 {
		return errSyntax
	}
	i, err := s.message(cmd.Args[0])
	if err != nil {
		return err
	}
	s.deleted[i] = true
	s.writef("+OK message %d deleted", i+1)
	return nil
}

// cmdRset unmarks all messages (RFC 1939 section 5).
func (s *session) cmdRset(ctx context.Context, cmd Command) error {
	if len(cmd.Args) != 0 {
		return errSyntax
	}
	clear(s.deleted)
	n, size := s.stat()
	s.writef("+OK maildrop has %d messages (%d octets)", n, size)
	return nil
}

// cmdQuit ends the session. In TRANSACTION it is the UPDATE state
// (RFC 1939 section 6): the marked messages are expunged atomically by
// Commit; on failure none is, and the reply says so.
func (s *session) cmdQuit(ctx context.Context, cmd Command) error {
	if len(cmd.Args) != 0 {
		return errSyntax
	}
	s.closeOnReply = true
	if s.state == stateAuthorization {
		s.writeLine("+OK " + s.cfg.hostname + " signing off")
		return nil
	}
	var del []int
	for i, d := range s.deleted {
		if d {
			del = append(del, i)
		}
	}
	drop := s.drop
	s.drop = nil // Commit unlocks; end must not Close as well
	if err := drop.Commit(ctx, del); err != nil {
		if !errors.Is(err, mailbox.ErrOutcomeUnknown) {
			s.log.Error("pop3: UPDATE failed", "deleted", len(del), "err", err)
		}
		return fmt.Errorf("%w: %w", errUpdateFailed, err) // errorReply decides
	}
	s.log.Info("pop3: logged out", "deleted", len(del))
	s.writef("+OK %s signing off (%d messages deleted)", s.cfg.hostname, len(del))
	return nil
}
