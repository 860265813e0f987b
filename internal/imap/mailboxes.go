package imap

import (
	"context"
	"strings"
)

// specialUses are the RFC 6154 attributes CREATE-SPECIAL-USE accepts.
var specialUses = []string{`\All`, `\Archive`, `\Drafts`, `\Flagged`, `\Junk`, `\Sent`, `\Trash`}

// cmdCreate: RFC 9051 section 6.3.4, with RFC 6154 section 3 USE.
func (s *session) cmdCreate(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	name, err := d.mailbox()
	if err != nil {
		return "", err
	}
	use := ""
	if d.accept(' ') {
		// create-param: "(" "USE" SP "(" use-attr ")" ")"; one attribute.
		err := d.list(func() error {
			kw, err := d.atom("")
			if err != nil || !strings.EqualFold(kw, "USE") {
				return syntaxErr("unknown CREATE parameter")
			}
			if err := d.sp(); err != nil {
				return err
			}
			return d.list(func() error {
				f, err := d.flag()
				if err != nil {
					return err
				}
				canon := ""
				for _, u := range specialUses {
					if strings.EqualFold(u, f) {
						canon = u
					}
				}
				if canon == "" {
					return &protoError{no: true, code: "USEATTR", text: "unsupported special-use attribute"}
				}
				if use != "" {
					return &protoError{no: true, code: "USEATTR", text: "one special-use attribute per mailbox"}
				}
				use = canon
				return nil
			})
		})
		if err != nil {
			return "", err
		}
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if err := s.mboxes.Create(ctx, name, use); err != nil {
		return "", err
	}
	return "CREATE completed", nil
}

// cmdDelete: RFC 9051 section 6.3.5.
func (s *session) cmdDelete(ctx context.Context, d *decoder, c *command) (string, error) {
	name, err := s.oneMailboxArg(d)
	if err != nil {
		return "", err
	}
	if err := s.mboxes.Delete(ctx, name); err != nil {
		return "", err
	}
	return "DELETE completed", nil
}

// cmdRename: RFC 9051 section 6.3.6 (INBOX semantics in the mailbox
// package).
func (s *session) cmdRename(ctx context.Context, d *decoder, c *command) (string, error) {
	var from, to string
	err := d.sp()
	if err == nil {
		from, err = d.mailbox()
	}
	if err == nil {
		err = d.sp()
	}
	if err == nil {
		to, err = d.mailbox()
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return "", err
	}
	if err := s.mboxes.Rename(ctx, from, to); err != nil {
		return "", err
	}
	return "RENAME completed", nil
}

// cmdSubscribe: RFC 9051 section 6.3.7.
func (s *session) cmdSubscribe(ctx context.Context, d *decoder, c *command) (string, error) {
	name, err := s.oneMailboxArg(d)
	if err != nil {
		return "", err
	}
	if err := s.mboxes.SetSubscribed(ctx, name, true); err != nil {
		return "", err
	}
	return "SUBSCRIBE completed", nil
}

// cmdUnsubscribe: RFC 9051 section 6.3.8.
func (s *session) cmdUnsubscribe(ctx context.Context, d *decoder, c *command) (string, error) {
	name, err := s.oneMailboxArg(d)
	if err != nil {
		return "", err
	}
	if err := s.mboxes.SetSubscribed(ctx, name, false); err != nil {
		return "", err
	}
	return "UNSUBSCRIBE completed", nil
}

func (s *session) oneMailboxArg(d *decoder) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	name, err := d.mailbox()
	if err != nil {
		return "", err
	}
	return name, d.end()
}
