package imap

import (
	"context"
	"strings"
	"time"
)

// cmdIdle: RFC 2177. Updates are pushed as soon as the mailbox changes
// (the view's Changed channel, fed by the mailbox Hub) and, with IdlePoll,
// at least that often for changes made by other processes, until the client
// sends DONE. A reader goroutine owns the connection's read side while
// idling and is joined before the command returns; the read timeout is
// the autologout timer (RFC 9051 section 5.4: at least 30 minutes), and a
// server shutdown wakes the read.
func (s *session) cmdIdle(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.end(); err != nil {
		return "", err
	}
	if s.view != nil {
		s.poll(ctx, true)
	}
	if err := s.Continue("idling"); err != nil {
		return "", errConnection{err}
	}
	type result struct {
		line string
		err  error
	}
	lines := make(chan result, 1)
	go func() {
		line, err := s.conn.ReadLine()
		lines <- result{string(line), err}
	}()
	var changed <-chan struct{}
	var tick <-chan time.Time
	if s.view != nil {
		changed = s.view.Changed()
		if s.cfg.idlePoll > 0 {
			t := time.NewTicker(s.cfg.idlePoll)
			defer t.Stop()
			tick = t.C
		}
	}
	for {
		var woke bool
		select {
		case <-changed:
			woke = true
		case <-tick:
			woke = true
		case r := <-lines:
			if r.err != nil {
				if s.readFailed(r.err) {
					return "", syntaxErr("expected DONE")
				}
				s.closing = true
				return "", errHandled
			}
			if !strings.EqualFold(r.line, "DONE") {
				return "", syntaxErr("expected DONE")
			}
			return "IDLE terminated", nil
		}
		if woke {
			s.poll(ctx, true)
			if err := s.conn.Flush(); err != nil {
				// The reader must end before the handler returns.
				_ = s.conn.Close()
				<-lines
				return "", errConnection{err}
			}
		}
	}
}
