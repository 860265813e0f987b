package imap

import (
	"context"
	"strings"

	"quill/internal/mailbox"
)

// cmdStore: RFC 3501 section 6.4.6 and UID STORE (section 6.4.8), with
// the UNCHANGEDSINCE modifier (RFC 7162 section 3.1.3).
func (s *session) cmdStore(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	set, err := d.seqSet()
	if err != nil {
		return "", err
	}
	if err := d.sp(); err != nil {
		return "", err
	}
	var unchangedSince uint64
	conditional := false
	if d.peek() == '(' {
		err := d.list(func() error {
			a, err := d.atom("")
			if err != nil {
				return err
			}
			if !strings.EqualFold(a, "UNCHANGEDSINCE") || conditional {
				return syntaxErr("unknown STORE modifier")
			}
			if err := d.sp(); err != nil {
				return err
			}
			unchangedSince, err = d.modSeq(true)
			conditional = true
			return err
		})
		if err != nil {
			return "", err
		}
		if err := d.sp(); err != nil {
			return "", err
		}
	}
	item, err := d.atom("")
	if err != nil {
		return "", err
	}
	item = strings.ToUpper(item)
	op := mailbox.FlagsReplace
	switch {
	case strings.HasPrefix(item, "+"):
		op, item = mailbox.FlagsAdd, item[1:]
	case strings.HasPrefix(item, "-"):
		op, item = mailbox.FlagsRemove, item[1:]
	}
	silent := false
	switch item {
	case "FLAGS":
	case "FLAGS.SILENT":
		silent = true
	default:
		return "", syntaxErr("expected FLAGS, +FLAGS or -FLAGS")
	}
	if err := d.sp(); err != nil {
		return "", err
	}
	var flags []string
	if d.peek() == '(' {
		if flags, err = d.flagList(); err != nil {
			return "", err
		}
	} else {
		for {
			f, err := d.flag()
			if err != nil {
				return "", err
			}
			flags = append(flags, f)
			if !d.accept(' ') {
				break
			}
		}
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if err := checkStoreFlags(flags); err != nil {
		return "", err
	}
	uids, err := s.resolve(set, c.uid)
	if err != nil {
		return "", err
	}
	if conditional {
		s.enableCondstore()
	}
	var changed []mailbox.Message
	var failed []uint32
	if conditional && unchangedSince == 0 {
		// Every message has a MODSEQ above 0: all fail, nothing changes.
		if s.view.ReadOnly() {
			return "", mailbox.ErrReadOnly
		}
		failed = uids
	} else if changed, failed, err = s.view.SetFlagsIf(ctx, uids, op, flags, unchangedSince); err != nil {
		return "", err
	}
	for _, m := range changed {
		// RFC 7162 section 3.1.3: with CONDSTORE the FETCH is sent even
		// for .SILENT, since the client needs the new MODSEQ.
		if silent && !s.condstore {
			continue
		}
		e := s.enc.raw("* ").num(m.Seq).raw(" FETCH (")
		if c.uid {
			e.raw("UID ").num(m.UID).sp()
		}
		if !silent {
			e.raw("FLAGS ").flags(m.Flags, s.recent(m.UID))
			if s.condstore {
				e.sp()
			}
		}
		if s.condstore {
			e.raw("MODSEQ (").num64(m.ModSeq).raw(")")
		}
		e.raw(")").crlf()
	}
	if len(failed) > 0 {
		nums := failed
		if !c.uid {
			nums = make([]uint32, 0, len(failed))
			for _, u := range failed {
				if seq := s.view.Seq(u); seq != 0 {
					nums = append(nums, seq)
				}
			}
		}
		return "[MODIFIED " + uidRange(nums) + "] conditional STORE failed", nil
	}
	return c.name + " completed", nil
}
