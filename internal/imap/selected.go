package imap

import (
	"context"
	"strings"

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

// qresyncParams are SELECT's QRESYNC parameter (RFC 7162 section 3.2.5).
type qresyncParams struct {
	uidValidity uint32
	modseq      uint64
	knownUIDs   *SeqSet
}

// selectMailbox: SELECT and EXAMINE with the CONDSTORE and QRESYNC
// select-params (RFC 7162 sections 3.1.8 and 3.2.5), answered as RFC 9051
// section 6.3.2 asks once IMAP4rev2 is enabled (no RECENT, no UNSEEN code,
// a LIST response) and as RFC 3501 section 6.3.1 asks otherwise.
func (s *session) selectMailbox(ctx context.Context, d *decoder, readOnly bool) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	name, err := d.mailbox()
	if err != nil {
		return "", err
	}
	condstore := false
	var qr *qresyncParams
	if d.accept(' ') {
		err := d.list(func() error {
			a, err := d.atom("")
			if err != nil {
				return err
			}
			switch strings.ToUpper(a) {
			case "CONDSTORE":
				condstore = true
				return nil
			case "QRESYNC":
				if !s.qresync {
					return syntaxErr("QRESYNC is not enabled")
				}
				if qr != nil {
					return syntaxErr("QRESYNC given twice")
				}
				qr = &qresyncParams{}
				return parseQresync(d, qr)
			}
			return syntaxErr("unknown SELECT parameter")
		})
		if err != nil {
			return "", err
		}
	}
	if err := d.end(); err != nil {
		return "", err
	}
	// A SELECT deselects first, even when it fails (RFC 9051 6.3.2); the
	// CLOSED code tells a client that knows it (RFC 7162 section 3.2.11).
	if s.view != nil && (s.rev2 || s.qresync) {
		s.enc.raw("* OK [CLOSED] previous mailbox closed").crlf()
	}
	s.unselect()
	if condstore {
		s.condstore = true
	}
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
	if !s.rev2 {
		e.raw("* ").num(info.Recent).raw(" RECENT").crlf()
		if info.FirstUnseen > 0 {
			e.raw("* OK [UNSEEN ").num(info.FirstUnseen).raw("] first unseen message").crlf()
		}
	}
	e.raw("* OK [UIDVALIDITY ").num(info.UIDValidity).raw("] UIDs valid").crlf()
	e.raw("* OK [UIDNEXT ").num(info.UIDNext).raw("] predicted next UID").crlf()
	// RFC 7162 section 3.1.2.1: every SELECT of a mailbox with MODSEQs.
	e.raw("* OK [HIGHESTMODSEQ ").num64(view.HighestModSeq()).raw("] highest modseq").crlf()
	if s.rev2 {
		if err := s.listSelected(ctx, name); err != nil {
			return "", err
		}
	}
	if qr != nil && qr.uidValidity == info.UIDValidity {
		if err := s.resync(ctx, qr.modseq, qr.knownUIDs, max(info.UIDNext, 1)-1, nil); err != nil {
			return "", err
		}
	}
	if readOnly {
		return "[READ-ONLY] EXAMINE completed", nil
	}
	return "[READ-WRITE] SELECT completed", nil
}

// parseQresync reads "(" uidvalidity SP mod-sequence-value [SP known-uids]
// [SP seq-match-data] ")". The sequence match data only narrows what the
// server must report; it is read and not used, so VANISHED (EARLIER) may
// name UIDs the client never had, which the RFC allows.
func parseQresync(d *decoder, qr *qresyncParams) error {
	if err := d.sp(); err != nil {
		return err
	}
	if err := d.expect('('); err != nil {
		return err
	}
	uv, err := d.number()
	if err != nil || uv == 0 {
		return syntaxErr("invalid UIDVALIDITY")
	}
	qr.uidValidity = uv
	if err := d.sp(); err != nil {
		return err
	}
	if qr.modseq, err = d.modSeq(false); err != nil {
		return err
	}
	if d.accept(' ') && d.peek() != '(' {
		set, err := d.seqSet()
		if err != nil {
			return err
		}
		if set.Saved {
			return syntaxErr("$ not allowed here")
		}
		qr.knownUIDs = &set
		d.accept(' ')
	}
	if d.peek() == '(' {
		err := d.list(func() error {
			_, err := d.seqSet()
			return err
		})
		if err != nil {
			return err
		}
	}
	return d.expect(')')
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
// 7.4.1 and 7.3.1 allow: EXPUNGE (or VANISHED), EXISTS (and, in
// IMAP4rev1, RECENT), FETCH FLAGS.
func (s *session) writeUpdates(up mailbox.Updates) {
	e := &s.enc
	if s.qresync {
		// RFC 7162 section 3.2.10: VANISHED replaces EXPUNGE.
		if len(up.ExpungedUIDs) > 0 {
			s.writeVanished(false, mailbox.RangesOf(up.ExpungedUIDs))
		}
	} else {
		for _, seq := range up.Expunged {
			e.raw("* ").num(seq).raw(" EXPUNGE").crlf()
		}
	}
	if up.Exists {
		e.raw("* ").num(s.view.Len()).raw(" EXISTS").crlf()
		if !s.rev2 {
			e.raw("* ").num(up.RecentCount).raw(" RECENT").crlf()
		}
	}
	for _, m := range up.Flags {
		e.raw("* ").num(m.Seq).raw(" FETCH (UID ").num(m.UID).raw(" FLAGS ").flags(m.Flags, s.recent(m.UID))
		if s.condstore {
			// RFC 7162 section 3.1.4: MODSEQ in every unsolicited FETCH.
			e.raw(" MODSEQ (").num64(m.ModSeq).raw(")")
		}
		e.raw(")").crlf()
	}
}
