package imap

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	"quill/internal/mailbox"
	"quill/internal/mime"
)

// cmdAppend: RFC 9051 section 6.3.12, with MULTIAPPEND (RFC 3502),
// APPENDUID (RFC 4315) and APPENDLIMIT (RFC 7889). The messages are
// appended in one transaction at the end, so MULTIAPPEND is all or
// nothing. Literals are held in memory, to be written with that
// transaction, while their sum stays within mailbox.InlineBodyMax; the
// others stream into the store as they arrive. A command thus holds no
// more memory than storing one body would, and an APPEND of a common
// message costs one store commit instead of two.
func (s *session) cmdAppend(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	name, err := d.mailbox()
	if err != nil {
		return "", err
	}
	// RFC 9051 section 6.3.12: a missing mailbox is refused with TRYCREATE,
	// before the client sends a synchronizing literal.
	if _, _, err := s.mboxes.Status(ctx, name, false); err != nil {
		return "", tryCreate(err)
	}
	// One transfer spans every literal of the command and the lines
	// between them.
	s.conn.BeginTransfer(s.cfg.minRate, s.cfg.transferGrace)
	defer s.conn.EndTransfer()
	var msgs []mailbox.NewMessage
	var inlined int64
	for {
		if err := d.sp(); err != nil {
			return "", err
		}
		var m mailbox.NewMessage
		if d.peek() == '(' {
			if m.Flags, err = d.flagList(); err != nil {
				return "", err
			}
			if err := checkStoreFlags(m.Flags); err != nil {
				return "", err
			}
			if err := d.sp(); err != nil {
				return "", err
			}
		}
		m.Date = time.Now()
		if d.peek() == '"' {
			if m.Date, err = d.dateTime(); err != nil {
				return "", err
			}
			if err := d.sp(); err != nil {
				return "", err
			}
		}
		// RFC 9051 section 6.3.12: a literal8 (BINARY) is accepted too.
		d.accept('~')
		r, n, err := d.literalReader(s.cfg.appendLimit, true)
		if err != nil {
			return "", err
		}
		// The summary is computed as the literal streams to the store, so
		// FETCH of ENVELOPE or BODYSTRUCTURE never parses it again.
		parser := mime.NewParser()
		inline := inlined+n <= mailbox.InlineBodyMax
		if inline {
			inlined += n
		}
		m.Body, err = s.mboxes.PutBody(ctx, io.TeeReader(r, parser), n, inline)
		if err != nil {
			// Stay in step with the client: the rest of the literal is
			// on its way.
			if _, derr := io.Copy(io.Discard, r); derr != nil {
				return "", errConnection{derr}
			}
			if derr := d.next(); derr != nil {
				return "", derr
			}
			return "", err
		}
		if err := d.next(); err != nil {
			return "", err
		}
		if sum := parser.Summary(); sum.Size == n {
			if m.Meta, err = sum.MarshalBinary(); err != nil {
				s.log.Warn("imap: APPEND summary not kept", "user", s.user, "err", err)
				m.Meta = nil
			}
		}
		msgs = append(msgs, m)
		if d.eol() {
			break
		}
	}
	res, err := s.mboxes.Append(ctx, name, msgs)
	if err != nil {
		return "", tryCreate(err)
	}
	return "[APPENDUID " + strconv.FormatUint(uint64(res.UIDValidity), 10) + " " + uidRange(res.UIDs) + "] APPEND completed", nil
}

// tryCreate turns a missing target mailbox into NO [TRYCREATE] (RFC 9051
// sections 6.3.12 and 6.4.7).
func tryCreate(err error) error {
	if errors.Is(err, mailbox.ErrNoSuchMailbox) {
		return &protoError{no: true, code: "TRYCREATE", text: "no such mailbox"}
	}
	return err
}

// uidRange renders ascending UIDs as a uid-set.
func uidRange(uids []uint32) string {
	var b []byte
	for i := 0; i < len(uids); {
		j := i
		for j+1 < len(uids) && uids[j+1] == uids[j]+1 {
			j++
		}
		if len(b) > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(uids[i]), 10)
		if j > i {
			b = append(b, ':')
			b = strconv.AppendUint(b, uint64(uids[j]), 10)
		}
		i = j + 1
	}
	return string(b)
}

// dateTime reads a quoted date-time (RFC 9051 section 9).
func (d *decoder) dateTime() (time.Time, error) {
	q, err := d.quoted()
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse("_2-Jan-2006 15:04:05 -0700", q)
	if err != nil {
		return time.Time{}, syntaxErr("bad date-time")
	}
	return t, nil
}

// date reads a date (RFC 9051 section 9, SEARCH): d-Mon-yyyy, optionally
// quoted.
func (d *decoder) date() (time.Time, error) {
	var s string
	var err error
	if d.peek() == '"' {
		s, err = d.quoted()
	} else {
		s, err = d.atom("")
	}
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse("2-Jan-2006", strings.TrimSpace(s))
	if err != nil {
		return time.Time{}, syntaxErr("bad date")
	}
	return t, nil
}

// checkStoreFlags refuses \Recent, which clients may not set (RFC 3501
// section 2.3.2).
func checkStoreFlags(flags []string) error {
	for _, f := range flags {
		if f == `\Recent` {
			return syntaxErr(`\Recent cannot be set`)
		}
	}
	return nil
}
