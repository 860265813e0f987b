package imap

import (
	"context"

	"quill/internal/mailbox"
)

// Quota (RFC 9208): each user has one quota root, named "", holding every
// mailbox of the user, with the STORAGE resource only (QUOTA=RES-STORAGE).
// The limit is the operator's (store.User.QuotaBytes); SETQUOTA is refused
// and QUOTASET is not advertised. A user without a limit has no quota
// root: GETQUOTAROOT lists none and GETQUOTA "" answers NO [NONEXISTENT].

// quotaRoot is the name of the user's one quota root.
const quotaRoot = ""

// kib converts octets to the STORAGE resource's unit of 1024 octets (RFC
// 9208 section 5.1), rounding up so that a non-empty usage is never 0.
func kib(n int64) uint64 {
	if n <= 0 {
		return 0
	}
	return uint64(n+1023) / 1024
}

var errNoQuotaRoot = &protoError{no: true, code: "NONEXISTENT", text: "no such quota root"}

// cmdGetQuota: RFC 9208 section 4.2.1.
func (s *session) cmdGetQuota(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	root, err := d.astring()
	if err != nil {
		return "", err
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if root != quotaRoot {
		return "", errNoQuotaRoot
	}
	q, err := s.mboxes.Quota(ctx)
	if err != nil {
		return "", err
	}
	if q.Limit <= 0 {
		return "", errNoQuotaRoot
	}
	s.writeQuota(q)
	return "GETQUOTA completed", nil
}

// cmdGetQuotaRoot: RFC 9208 section 4.2.2. The mailbox must exist.
func (s *session) cmdGetQuotaRoot(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	name, err := d.mailbox()
	if err != nil {
		return "", err
	}
	if err := d.end(); err != nil {
		return "", err
	}
	info, _, err := s.mboxes.Status(ctx, name, false)
	if err != nil {
		return "", err
	}
	q, err := s.mboxes.Quota(ctx)
	if err != nil {
		return "", err
	}
	s.enc.raw("* QUOTAROOT ").mailbox(info.Name, s.rev2)
	if q.Limit > 0 {
		s.enc.sp().str(quotaRoot).crlf()
		s.writeQuota(q)
	} else {
		s.enc.crlf()
	}
	return "GETQUOTAROOT completed", nil
}

// cmdSetQuota: RFC 9208 section 4.2.3, refused: quotas are set by the
// operator (quill user ...). The arguments are not parsed.
func (s *session) cmdSetQuota(ctx context.Context, d *decoder, c *command) (string, error) {
	return "", &protoError{no: true, code: "NOPERM", text: "quotas are set by the operator"}
}

// writeQuota sends the QUOTA response of the user's root (RFC 9208
// section 4.3.2).
func (s *session) writeQuota(q mailbox.Quota) {
	s.enc.raw("* QUOTA ").str(quotaRoot).raw(" (STORAGE ").num64(kib(q.Used)).sp().num64(uint64(q.Limit) / 1024).raw(")").crlf()
}
