package imap

import (
	"context"
	"errors"
	"strconv"

	"quill/internal/mailbox"
)

// cmdCopy: RFC 3501 section 6.4.7 with COPYUID (RFC 4315).
func (s *session) cmdCopy(ctx context.Context, d *decoder, c *command) (string, error) {
	res, err := s.copy(ctx, d, c)
	if err != nil && !(errors.Is(err, mailbox.ErrExpunged) && len(res.Dest) > 0) {
		return "", tryCreate(err)
	}
	if len(res.Dest) == 0 {
		return c.name + " completed", nil
	}
	return copyUID(res) + " " + c.name + " completed", nil
}

// cmdMove: RFC 6851. The view moves the messages atomically (the user
// manager's one batch); the EXPUNGE responses, which must follow the
// COPYUID, come from the dispatcher's poll.
func (s *session) cmdMove(ctx context.Context, d *decoder, c *command) (string, error) {
	res, err := s.copy(ctx, d, c)
	if err != nil && !(errors.Is(err, mailbox.ErrExpunged) && len(res.Dest) > 0) {
		return "", tryCreate(err)
	}
	if len(res.Dest) > 0 {
		s.enc.raw("* OK ").raw(copyUID(res)).raw(" moved").crlf()
	}
	return c.name + " completed", nil
}

func (s *session) copy(ctx context.Context, d *decoder, c *command) (mailbox.CopyResult, error) {
	var set SeqSet
	var dest string
	err := d.sp()
	if err == nil {
		set, err = d.seqSet()
	}
	if err == nil {
		err = d.sp()
	}
	if err == nil {
		dest, err = d.mailbox()
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return mailbox.CopyResult{}, err
	}
	uids, err := s.resolve(set, c.uid)
	if err != nil {
		return mailbox.CopyResult{}, err
	}
	move := c.name == "MOVE" || c.name == "UID MOVE"
	if move && s.view.ReadOnly() {
		return mailbox.CopyResult{}, mailbox.ErrReadOnly
	}
	if len(uids) == 0 {
		// Still check the destination, as a client expects TRYCREATE.
		_, _, err := s.mboxes.Status(ctx, dest, false)
		return mailbox.CopyResult{}, err
	}
	if move {
		// A move does not grow the user's usage: no quota check (RFC
		// 9208 section 4.3 applies to COPY and APPEND).
		return s.view.Move(ctx, uids, dest)
	}
	return s.view.Copy(ctx, uids, dest)
}

func copyUID(r mailbox.CopyResult) string {
	return "[COPYUID " + strconv.FormatUint(uint64(r.UIDValidity), 10) + " " + uidRange(r.Source) + " " + uidRange(r.Dest) + "]"
}
