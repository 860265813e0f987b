package imap

import (
	"context"
	"strings"

	"quill/internal/mailbox"
)

// cmdStore: RFC 3501 section 6.4.6 and UID STORE (section 6.4.8).
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
	changed, err := s.view.SetFlags(ctx, uids, op, flags)
	if err != nil {
		return "", err
	}
	if !silent {
		for _, m := range changed {
			e := s.enc.raw("* ").num(m.Seq).raw(" FETCH (")
			if c.uid {
				e.raw("UID ").num(m.UID).sp()
			}
			e.raw("FLAGS ").flags(m.Flags, s.view.Recent(m.UID)).raw(")").crlf()
		}
	}
	return c.name + " completed", nil
}
