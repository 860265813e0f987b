package imap

import (
	"context"

	"quill/internal/mailbox"
)

// systemFlags are the flags of RFC 9051 section 2.3.2 a client may set.
const systemFlags = `\Answered \Flagged \Deleted \Seen \Draft`

// cmdSelect: RFC 3501 section 6.3.1.
func (s *session) cmdSelect(ctx context.Context, d *decoder, c *command) (string, error) {
	return s.selectMailbox(ctx, d, false)
}

// cmdExamine: RFC 3501 section 6.3.2.
func (s *session) cmdExamine(ctx context.Context, d *decoder, c *command) (string, error) {
	return s.selectMailbox(ctx, d, true)
}

func (s *session) selectMailbox(ctx context.Context, d *decoder, readOnly bool) (string, error) {
	name, err := s.oneMailboxArg(d)
	if err != nil {
		return "", err
	}
	// A SELECT deselects first, even when it fails (RFC 9051 6.3.2).
	s.unselect()
	view, info, err := s.mboxes.Select(ctx, name, readOnly)
	if err != nil {
		return "", err
	}
	s.view, s.state = view, stateSelected
	e := &s.enc
	e.raw("* FLAGS (").raw(systemFlags)
	for _, k := range info.Keywords {
		e.sp().raw(k)
	}
	e.raw(")").crlf()
	if readOnly {
		e.raw("* OK [PERMANENTFLAGS ()] read-only mailbox").crlf()
	} else {
		e.raw("* OK [PERMANENTFLAGS (").raw(systemFlags)
		for _, k := range info.Keywords {
			e.sp().raw(k)
		}
		e.raw(` \*)] flags permitted`).crlf()
	}
	e.raw("* ").num(info.Exists).raw(" EXISTS").crlf()
	e.raw("* ").num(info.Recent).raw(" RECENT").crlf()
	if info.FirstUnseen > 0 {
		e.raw("* OK [UNSEEN ").num(info.FirstUnseen).raw("] first unseen message").crlf()
	}
	e.raw("* OK [UIDVALIDITY ").num(info.UIDValidity).raw("] UIDs valid").crlf()
	e.raw("* OK [UIDNEXT ").num(info.UIDNext).raw("] predicted next UID").crlf()
	if readOnly {
		return "[READ-ONLY] EXAMINE completed", nil
	}
	return "[READ-WRITE] SELECT completed", nil
}

// cmdClose: RFC 9051 section 6.4.1: expunge silently, then deselect.
func (s *session) cmdClose(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.end(); err != nil {
		return "", err
	}
	var err error
	if !s.view.ReadOnly() {
		err = s.expungeDeleted(ctx, s.view.UIDs())
	}
	s.unselect()
	if err != nil {
		return "", err
	}
	return "CLOSE completed", nil
}

// cmdUnselect: RFC 3691.
func (s *session) cmdUnselect(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.end(); err != nil {
		return "", err
	}
	s.unselect()
	return "UNSELECT completed", nil
}

// cmdExpunge: RFC 9051 section 6.4.3, and UID EXPUNGE (RFC 4315 section
// 2.1). The EXPUNGE responses come from the dispatcher's poll, which
// reports this session's expunges and everyone else's alike.
func (s *session) cmdExpunge(ctx context.Context, d *decoder, c *command) (string, error) {
	uids := s.view.UIDs()
	if c.uid {
		if err := d.sp(); err != nil {
			return "", err
		}
		set, err := d.seqSet()
		if err != nil {
			return "", err
		}
		if set.Saved {
			return "", syntaxErr("$ not allowed here")
		}
		uids = uidsByUID(set, uids)
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if s.view.ReadOnly() {
		return "", mailbox.ErrReadOnly
	}
	if err := s.expungeDeleted(ctx, uids); err != nil {
		return "", err
	}
	return "EXPUNGE completed", nil
}

// expungeDeleted expunges the messages of uids that have \Deleted.
func (s *session) expungeDeleted(ctx context.Context, uids []uint32) error {
	var del []uint32
	err := s.view.Messages(ctx, uids, func(m mailbox.Message) error {
		for _, f := range m.Flags {
			if f == `\Deleted` {
				del = append(del, m.UID)
				break
			}
		}
		return nil
	})
	if err != nil && err != mailbox.ErrExpunged {
		return err
	}
	return s.view.Expunge(ctx, del)
}

// writeUpdates sends what a poll found, in the order RFC 9051 section
// 7.4.1 and 7.3.1 allow: EXPUNGE, EXISTS (and RECENT), FETCH FLAGS.
func (s *session) writeUpdates(up mailbox.Updates) {
	e := &s.enc
	for _, seq := range up.Expunged {
		e.raw("* ").num(seq).raw(" EXPUNGE").crlf()
	}
	if up.Exists {
		e.raw("* ").num(s.view.Len()).raw(" EXISTS").crlf()
		e.raw("* ").num(up.RecentCount).raw(" RECENT").crlf()
	}
	for _, m := range up.Flags {
		e.raw("* ").num(m.Seq).raw(" FETCH (UID ").num(m.UID).raw(" FLAGS ").flags(m.Flags, s.view.Recent(m.UID)).raw(")").crlf()
	}
}
