package loadgen

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"sort"
	"strings"
)

// StripTrace returns msg without the trace header fields a receiving server
// prepends (RFC 5321 section 4.4: Return-Path and Received), including
// their folded continuation lines. Only leading fields are removed; the
// result is a suffix of msg.
func StripTrace(msg []byte) []byte {
	for {
		name, ok := fieldName(msg)
		if !ok || !(strings.EqualFold(name, "Return-Path") || strings.EqualFold(name, "Received")) {
			return msg
		}
		msg = skipField(msg)
	}
}

// fieldName returns the name of the header field msg starts with.
func fieldName(msg []byte) (string, bool) {
	for i, c := range msg {
		switch {
		case c == ':':
			return string(msg[:i]), i > 0
		case c <= ' ' || c >= 0x7f: // RFC 5322 section 2.2: ftext is printable US-ASCII except ':'
			return "", false
		}
	}
	return "", false
}

// skipField returns msg after its first header field and the field's
// continuation lines.
func skipField(msg []byte) []byte {
	for {
		i := bytes.IndexByte(msg, '\n')
		if i < 0 {
			return msg[len(msg):]
		}
		msg = msg[i+1:]
		if len(msg) == 0 || (msg[0] != ' ' && msg[0] != '\t') {
			return msg
		}
	}
}

// HeaderValue returns the unfolded, trimmed value of the first header field
// called name in msg's header section, and whether there was one.
func HeaderValue(msg []byte, name string) (string, bool) {
	for len(msg) > 0 {
		if msg[0] == '\r' || msg[0] == '\n' {
			return "", false // the empty line: end of the header section
		}
		rest := skipField(msg)
		field := msg[:len(msg)-len(rest)]
		msg = rest
		n, ok := fieldName(field)
		if !ok || !strings.EqualFold(n, name) {
			continue
		}
		v := field[len(n)+1:]
		v = bytes.ReplaceAll(v, []byte("\r\n"), nil)
		v = bytes.ReplaceAll(v, []byte("\n"), nil)
		return string(bytes.TrimSpace(v)), true
	}
	return "", false
}

// Report is the outcome of a verification. Pairs are (message id, mailbox).
type Report struct {
	// Acked is the number of (message, recipient) pairs the server
	// acknowledged; each must be present exactly once, intact.
	Acked int `json:"acked"`
	// Present counts acknowledged pairs found intact (once or more).
	Present int `json:"present"`
	// UnackedPresent counts pairs of unacknowledged messages found intact:
	// allowed, since the server may have committed before failing to reply.
	UnackedPresent int `json:"unacked_present"`
	// Missing lists acknowledged pairs not found intact.
	Missing []string `json:"missing,omitempty"`
	// Corrupt lists messages found whose content differs from what was
	// sent (acknowledged or not), or that sit in a mailbox they were not
	// addressed to.
	Corrupt []string `json:"corrupt,omitempty"`
	// Duplicated lists pairs found more than once.
	Duplicated []string `json:"duplicated,omitempty"`
	// Foreign counts retrieved messages without a known id.
	Foreign int `json:"foreign"`
}

// OK reports whether no acknowledged message was lost, duplicated or
// corrupted, and nothing was corrupted at all.
func (r *Report) OK() bool {
	return len(r.Missing) == 0 && len(r.Corrupt) == 0 && len(r.Duplicated) == 0
}

func (r *Report) String() string {
	return fmt.Sprintf("acked=%d present=%d unacked_present=%d missing=%d corrupt=%d duplicated=%d foreign=%d",
		r.Acked, r.Present, r.UnackedPresent, len(r.Missing), len(r.Corrupt), len(r.Duplicated), r.Foreign)
}

type pairKey struct{ id, mailbox string }

// Verifier checks retrieved mailboxes against the records of a run. Feed it
// every message of every mailbox with Observe, then call Report. It is not
// safe for concurrent use.
type Verifier struct {
	byID    map[string]*Record
	seen    map[pairKey]int
	corrupt []string
	foreign int
}

// NewVerifier returns a Verifier for records. Mailbox names are compared
// case-insensitively with the records' recipients.
func NewVerifier(records []*Record) *Verifier {
	v := &Verifier{byID: make(map[string]*Record, len(records)), seen: make(map[pairKey]int)}
	for _, r := range records {
		v.byID[r.ID] = r
	}
	return v
}

// Observe checks one message retrieved from mailbox, as stored (trace
// fields included).
func (v *Verifier) Observe(mailbox string, msg []byte) {
	mailbox = strings.ToLower(mailbox)
	body := StripTrace(msg)
	id, ok := HeaderValue(body, IDHeader)
	if !ok {
		v.foreign++
		return
	}
	r, ok := v.byID[id]
	if !ok {
		v.foreign++
		return
	}
	if sha256.Sum256(body) != r.Sum {
		v.corrupt = append(v.corrupt, fmt.Sprintf("%s in %s: content differs (%d octets stored, %d sent)", id, mailbox, len(body), r.Size))
		return
	}
	if rcptIndex(r, mailbox) < 0 {
		v.corrupt = append(v.corrupt, fmt.Sprintf("%s in %s: not addressed to this mailbox", id, mailbox))
		return
	}
	v.seen[pairKey{id, mailbox}]++
}

func rcptIndex(r *Record, mailbox string) int {
	for i, rc := range r.Rcpts {
		if strings.EqualFold(rc, mailbox) {
			return i
		}
	}
	return -1
}

// Report returns the verdict over everything observed so far.
func (v *Verifier) Report() Report {
	rep := Report{Corrupt: append([]string(nil), v.corrupt...), Foreign: v.foreign}
	for _, r := range v.byID {
		for i, rc := range r.Rcpts {
			k := pairKey{r.ID, strings.ToLower(rc)}
			n := v.seen[k]
			acked := r.Outcome == Acked && i < len(r.Accepted) && r.Accepted[i]
			if n > 1 {
				rep.Duplicated = append(rep.Duplicated, fmt.Sprintf("%s in %s: %d copies", r.ID, k.mailbox, n))
			}
			switch {
			case acked && n > 0:
				rep.Acked++
				rep.Present++
			case acked:
				rep.Acked++
				rep.Missing = append(rep.Missing, fmt.Sprintf("%s in %s", r.ID, k.mailbox))
			case n > 0:
				rep.UnackedPresent++
			}
		}
	}
	sort.Strings(rep.Missing)
	sort.Strings(rep.Duplicated)
	sort.Strings(rep.Corrupt)
	return rep
}

// VerifyPOP3 retrieves every mailbox in passwords (mailbox -> password)
// from the POP3 listener at o.Addr and verifies it against records. o.User
// and o.Password are ignored.
func VerifyPOP3(ctx context.Context, records []*Record, o POP3Options, passwords map[string]string) (Report, error) {
	v := NewVerifier(records)
	mailboxes := make([]string, 0, len(passwords))
	for mb := range passwords {
		mailboxes = append(mailboxes, mb)
	}
	sort.Strings(mailboxes)
	for _, mb := range mailboxes {
		o.User, o.Password = mb, passwords[mb]
		err := FetchPOP3(ctx, o, func(_ int, msg []byte) error {
			v.Observe(mb, msg)
			return nil
		})
		if err != nil {
			return Report{}, fmt.Errorf("mailbox %s: %w", mb, err)
		}
	}
	return v.Report(), nil
}
