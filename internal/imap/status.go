package imap

import (
	"context"
	"strings"
)

// cmdStatus: RFC 9051 section 6.3.11, with SIZE (RFC 8438), DELETED (RFC
// 9051), HIGHESTMODSEQ (RFC 7162 section 3.1.7) and DELETED-STORAGE (RFC
// 9208 section 4.2.5, in KiB).
func (s *session) cmdStatus(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	name, err := d.mailbox()
	if err != nil {
		return "", err
	}
	if err := d.sp(); err != nil {
		return "", err
	}
	items, err := parseStatusItems(d)
	if err != nil {
		return "", err
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if err := s.writeStatus(ctx, name, items); err != nil {
		return "", err
	}
	return "STATUS completed", nil
}

// parseStatusItems reads a parenthesized, non-empty list of status-att.
func parseStatusItems(d *decoder) ([]string, error) {
	var items []string
	err := d.list(func() error {
		a, err := d.atom("")
		if err != nil {
			return err
		}
		a = strings.ToUpper(a)
		switch a {
		case "MESSAGES", "RECENT", "UIDNEXT", "UIDVALIDITY", "UNSEEN", "SIZE", "DELETED", "HIGHESTMODSEQ", "DELETED-STORAGE":
		default:
			return syntaxErr("unknown STATUS item")
		}
		items = append(items, a)
		return nil
	})
	if err == nil && len(items) == 0 {
		err = syntaxErr("STATUS needs an item")
	}
	return items, err
}

// writeStatus sends one STATUS response for name.
func (s *session) writeStatus(ctx context.Context, name string, items []string) error {
	count := false
	for _, it := range items {
		count = count || it == "UNSEEN" || it == "DELETED" || it == "DELETED-STORAGE"
		if it == "HIGHESTMODSEQ" {
			s.enableCondstore()
		}
	}
	info, n, err := s.mboxes.Status(ctx, name, count)
	if err != nil {
		return err
	}
	s.enc.raw("* STATUS ").mailbox(info.Name, s.rev2).raw(" (")
	for i, it := range items {
		if i > 0 {
			s.enc.sp()
		}
		s.enc.raw(it).sp()
		switch it {
		case "MESSAGES":
			s.enc.num(info.Messages)
		case "RECENT":
			// \Recent is claimed by sessions that select the mailbox;
			// STATUS does not see it (an IMAP4rev1 hint only).
			s.enc.num(0)
		case "UIDNEXT":
			s.enc.num(info.UIDNext)
		case "UIDVALIDITY":
			s.enc.num(info.UIDValidity)
		case "UNSEEN":
			s.enc.num(n.Unseen)
		case "DELETED":
			s.enc.num(n.Deleted)
		case "SIZE":
			s.enc.num64(uint64(info.Size))
		case "DELETED-STORAGE":
			s.enc.num64(kib(n.DeletedSize))
		case "HIGHESTMODSEQ":
			s.enc.num64(info.HighestModSeq)
		}
	}
	s.enc.raw(")").crlf()
	return nil
}
