package imap

import (
	"context"
	"strings"
)

// cmdStatus: RFC 9051 section 6.3.11, with SIZE (RFC 8438).
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
	var items []string
	err = d.list(func() error {
		a, err := d.atom("")
		if err != nil {
			return err
		}
		a = strings.ToUpper(a)
		switch a {
		case "MESSAGES", "RECENT", "UIDNEXT", "UIDVALIDITY", "UNSEEN", "SIZE":
		default:
			return syntaxErr("unknown STATUS item")
		}
		items = append(items, a)
		return nil
	})
	if err != nil {
		return "", err
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if len(items) == 0 {
		return "", syntaxErr("STATUS needs an item")
	}
	unseen := false
	for _, it := range items {
		unseen = unseen || it == "UNSEEN"
	}
	info, nUnseen, err := s.mboxes.Status(ctx, name, unseen)
	if err != nil {
		return "", err
	}
	s.enc.raw("* STATUS ").astring(info.Name).raw(" (")
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
			s.enc.num(nUnseen)
		case "SIZE":
			s.enc.num64(uint64(info.Size))
		}
	}
	s.enc.raw(")").crlf()
	return "STATUS completed", nil
}
