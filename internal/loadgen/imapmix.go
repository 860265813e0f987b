package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// IMAP retrieval sessions of the mix (MixConfig.Retrieval "imap"): the
// counterpart of pop3Session, with the same result and contract. One
// command at a time, in the syntax IMAP4rev1 and IMAP4rev2 share
// (RFC 3501, RFC 9051):
//
//	S: * OK ...
//	C: a1 LOGIN "user" "password"          loginAt: its tagged OK
//	C: a2 SELECT INBOX                     N from "* N EXISTS"
//	C: a3 FETCH 1:N (FLAGS ENVELOPE)       what a client lists; discarded
//	C: a4 FETCH 1:N (UID BODY.PEEK[])      every body, with its UID
//	C: a5 UID STORE <uids> +FLAGS.SILENT (\Deleted)
//	C: a6 EXPUNGE                          the deletion: counts from here
//	C: a7 LOGOUT
//
// The sets are sequence ranges 1:N from SELECT, never 1:*, so mail
// delivered during the session is neither fetched nor flagged and cannot
// be expunged unseen. The body fetch is a sequence FETCH asking for the
// UID item: UID FETCH 1:N would name UIDs 1 to N, which after the first
// expunge are no longer the mailbox's messages. IMAP has no [IN-USE]: two
// sessions on one mailbox would both retrieve, and count, the same
// messages, so a run never starts two for one user (mixRun.retrieve).

// IMAP limits. A response line (between literals) may be long: a FETCH of
// flags and envelopes puts a whole envelope on one line unless the server
// chose literals. A response may carry at most maxIMAPLiterals literals,
// and all of it, lines and literals, is bounded by the caller per command.
const (
	maxIMAPLine     = maxMessageLine
	maxIMAPLiterals = 1024
	// maxIMAPEnvelope bounds one FLAGS ENVELOPE response and any response
	// that carries no body.
	maxIMAPEnvelope = 1 << 20
)

// imapSession logs in as user, fetches the flags and envelopes of the
// messages SELECT announced, then their bodies, flags them \Deleted and
// expunges them. Counts are reported only when EXPUNGE succeeds, since
// until then nothing was deleted.
func imapSession(ctx context.Context, cfg *MixConfig, user, idPfx, wantID string) (res pop3Result) {
	t0 := time.Now()
	conn, err := cfg.Dialer.DialContext(ctx, "tcp", cfg.IMAPAddr)
	if err != nil {
		res.err = fmt.Errorf("imap dial: %w", err)
		return res
	}
	defer conn.Close()
	defer watch(ctx, conn)()
	c := newIMAPConn(newLineConn(ctx, conn, cfg.Timeout))
	c.arm()
	greet, err := c.ir.read(maxIMAPEnvelope)
	if err != nil {
		res.err = fmt.Errorf("imap greeting: %w", err)
		return res
	}
	if g := greet.lines[0]; !hasPrefixFold(g, "* OK") {
		res.err = fmt.Errorf("imap greeting: server said %q", g)
		return res
	}
	u, err := imapQuote(user)
	if err != nil {
		res.err = err
		return res
	}
	pw, err := imapQuote(cfg.Password)
	if err != nil {
		res.err = err
		return res
	}
	if err := c.cmd("LOGIN "+u+" "+pw, maxIMAPEnvelope, nil); err != nil {
		res.err = fmt.Errorf("imap LOGIN: %w", err)
		return res
	}
	res.loginAt = time.Now()
	res.login = res.loginAt.Sub(t0)
	n := -1
	err = c.cmd("SELECT INBOX", maxIMAPEnvelope, func(r *imapResponse) error {
		if k, ok := parseExists(r.lines[0]); ok {
			n = k
		}
		return nil
	})
	switch {
	case err != nil:
		res.err = fmt.Errorf("imap SELECT: %w", err)
		return res
	case n < 0:
		res.err = fmt.Errorf("%w: SELECT without EXISTS", ErrProtocol)
		return res
	}
	var msgs, bytes, runMsgs int64
	found := false
	var uids []uint32
	if n > 0 {
		set := "1:" + strconv.Itoa(n)
		if err := c.cmd("FETCH "+set+" (FLAGS ENVELOPE)", maxIMAPEnvelope, nil); err != nil {
			res.err = fmt.Errorf("imap FETCH: %w", err)
			return res
		}
		err := c.cmd("FETCH "+set+" (UID BODY.PEEK[])", maxRetrieved+maxIMAPLine, func(r *imapResponse) error {
			uid, msg, ok, err := fetchedBody(r)
			if err != nil || !ok {
				return err
			}
			uids = append(uids, uid)
			msgs++
			bytes += int64(len(msg))
			if id, ok := HeaderValue(StripTrace(msg), IDHeader); ok && strings.HasPrefix(id, idPfx) {
				runMsgs++
				found = found || id == wantID
			}
			return nil
		})
		if err != nil {
			res.err = fmt.Errorf("imap FETCH bodies: %w", err)
			return res
		}
	}
	if len(uids) > 0 {
		if err := c.cmd("UID STORE "+uidSet(uids)+` +FLAGS.SILENT (\Deleted)`, maxIMAPEnvelope, nil); err != nil {
			res.err = fmt.Errorf("imap UID STORE: %w", err)
			return res
		}
		if err := c.cmd("EXPUNGE", maxIMAPEnvelope, nil); err != nil {
			res.err = fmt.Errorf("imap EXPUNGE: %w", err)
			return res
		}
	}
	res.msgs, res.bytes, res.runMsgs, res.foundID = msgs, bytes, runMsgs, found
	// The deletions took effect at EXPUNGE: a failed LOGOUT must not make
	// the drain wait for messages that are gone, so its error is dropped.
	_ = c.cmd("LOGOUT", maxIMAPEnvelope, nil)
	return res
}

// imapConn is the client side of an IMAP session.
type imapConn struct {
	*lineConn
	ir  imapReader
	tag int
}

func newIMAPConn(lc *lineConn) *imapConn {
	return &imapConn{lineConn: lc, ir: imapReader{r: lc.r}}
}

// cmd sends one tagged command and reads the responses up to its tagged
// status, each bounded by max octets, handing every untagged one to fn
// (nil discards them). A tagged NO or BAD is an *IMAPStatusError; an
// error from fn is returned as it is, and the session is then unusable.
func (c *imapConn) cmd(line string, max int, fn func(*imapResponse) error) error {
	_, err := c.cmdText(line, max, fn)
	return err
}

// cmdText is cmd that also returns the text of the tagged OK (its
// response code included, e.g. "[APPENDUID 7 3] APPEND completed").
func (c *imapConn) cmdText(line string, max int, fn func(*imapResponse) error) (string, error) {
	c.tag++
	tag := "a" + strconv.Itoa(c.tag)
	if err := c.writeLine(tag + " " + line); err != nil {
		return "", err
	}
	return c.untilTagged(tag, max, fn)
}

// untilTagged reads responses up to the one tagged tag; see cmd.
func (c *imapConn) untilTagged(tag string, max int, fn func(*imapResponse) error) (string, error) {
	for {
		c.arm()
		r, err := c.ir.read(max)
		if err != nil {
			return "", err
		}
		first := r.lines[0]
		if t, rest, ok := bytes.Cut(first, []byte(" ")); ok && string(t) == tag {
			if err := taggedStatus(first, rest); err != nil {
				return "", err
			}
			return string(bytes.TrimLeft(rest[2:], " ")), nil
		}
		if len(first) < 2 || first[0] != '*' || first[1] != ' ' {
			// We never send a synchronising literal, so a continuation
			// request ("+") is as unexpected as a foreign tag.
			return "", fmt.Errorf("%w: unexpected response %q", ErrProtocol, first)
		}
		if fn != nil {
			if err := fn(r); err != nil {
				return "", err
			}
		}
	}
}

// IMAPStatusError is a tagged NO or BAD (RFC 9051 section 7.1): the
// server refused the command.
type IMAPStatusError struct {
	Line string // the whole tagged response
}

func (e *IMAPStatusError) Error() string { return fmt.Sprintf("server said %q", e.Line) }

// taggedStatus interprets a tagged response: nil for OK, an
// *IMAPStatusError for NO and BAD.
func taggedStatus(line, rest []byte) error {
	switch {
	case hasPrefixFold(rest, "OK"):
		return nil
	case hasPrefixFold(rest, "NO"), hasPrefixFold(rest, "BAD"):
		return &IMAPStatusError{Line: string(line)}
	}
	return fmt.Errorf("%w: bad tagged response %q", ErrProtocol, line)
}

// imapResponse is one server response as read (RFC 9051 section 2.2.2):
// lines[0] starts it, lits[i] follows lines[i] (which ends with the
// literal's "{n}"), and lines[i+1] continues after lits[i]. Lines have no
// CRLF. Everything aliases the reader's buffer, valid until the next read.
type imapResponse struct {
	lines, lits [][]byte
}

// imapReader reads whole responses, literals included, with bounded
// memory: a line is at most maxIMAPLine octets, a response at most the
// bound given to read and maxIMAPLiterals literals.
type imapReader struct {
	r    *bufio.Reader // its buffer must hold maxIMAPLine+2 octets
	buf  []byte
	ends []int // where each line and literal ends in buf, in order
	resp imapResponse
}

// read reads the next response, which may not exceed max octets of lines
// and literals together.
func (ir *imapReader) read(max int) (*imapResponse, error) {
	ir.buf, ir.ends = ir.buf[:0], ir.ends[:0]
	for {
		line, err := readLine(ir.r, maxIMAPLine)
		if err != nil {
			return nil, err
		}
		if len(line) > max-len(ir.buf) {
			return nil, fmt.Errorf("%w: response larger than %d octets", ErrProtocol, max)
		}
		first := len(ir.ends) == 0
		ir.buf = append(ir.buf, line...)
		ir.ends = append(ir.ends, len(ir.buf))
		if first && !mayCarryLiteral(line) {
			break
		}
		n, ok, err := literalSize(line)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if len(ir.ends)/2 == maxIMAPLiterals {
			return nil, fmt.Errorf("%w: response with more than %d literals", ErrProtocol, maxIMAPLiterals)
		}
		if n > max-len(ir.buf) {
			return nil, fmt.Errorf("%w: literal of %d octets in a response bounded to %d", ErrProtocol, n, max)
		}
		start := len(ir.buf)
		ir.buf = slices.Grow(ir.buf, n)[:start+n]
		if _, err := io.ReadFull(ir.r, ir.buf[start:]); err != nil {
			return nil, err
		}
		ir.ends = append(ir.ends, len(ir.buf))
	}
	ir.resp.lines, ir.resp.lits = ir.resp.lines[:0], ir.resp.lits[:0]
	prev := 0
	for i, end := range ir.ends {
		if i%2 == 0 {
			ir.resp.lines = append(ir.resp.lines, ir.buf[prev:end])
		} else {
			ir.resp.lits = append(ir.resp.lits, ir.buf[prev:end])
		}
		prev = end
	}
	return &ir.resp, nil
}

// mayCarryLiteral reports whether a response starting with line may
// contain literals: untagged data, not a status response, whose text is
// free-form (RFC 9051 section 7.1) and may end in "{n}" by chance.
func mayCarryLiteral(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("* "))
	if !ok {
		return false
	}
	for _, cond := range []string{"OK", "NO", "BAD", "BYE", "PREAUTH"} {
		if hasPrefixFold(rest, cond) && (len(rest) == len(cond) || rest[len(cond)] == ' ') {
			return false
		}
	}
	return true
}

// literalSize parses the literal announcement a line may end with:
// "{n}", "{n+}" (RFC 7888) or "~{n}" (RFC 3516). ok is false when the
// line announces none; a malformed or huge count is an error.
func literalSize(line []byte) (n int, ok bool, err error) {
	if len(line) == 0 || line[len(line)-1] != '}' {
		return 0, false, nil
	}
	open := bytes.LastIndexByte(line, '{')
	if open < 0 {
		return 0, false, nil
	}
	digits := bytes.TrimSuffix(line[open+1:len(line)-1], []byte("+"))
	if len(digits) == 0 {
		return 0, false, nil
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false, nil
		}
	}
	if len(digits) > 10 {
		return 0, false, fmt.Errorf("%w: literal size %q", ErrProtocol, digits)
	}
	// At most 10 digits parse; an IMAP number has 32 bits (RFC 9051).
	v, _ := strconv.ParseUint(string(digits), 10, 64)
	if v > 1<<32-1 {
		return 0, false, fmt.Errorf("%w: literal size %q", ErrProtocol, digits)
	}
	return int(v), true, nil
}

// parseExists parses "* N EXISTS" (RFC 9051 section 7.4.1).
func parseExists(line []byte) (int, bool) {
	f := bytes.Fields(line)
	if len(f) != 3 || string(f[0]) != "*" || !bytes.EqualFold(f[2], []byte("EXISTS")) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(f[1]), 10, 31)
	return int(n), err == nil
}

// fetchedBody returns the UID and the BODY[] literal of a FETCH response.
// ok is false for a response that is no FETCH or carries no body (an
// unsolicited flag update); a body without its UID is an error, since a
// UID-less message could not be deleted.
func fetchedBody(r *imapResponse) (uid uint32, body []byte, ok bool, err error) {
	f := bytes.Fields(r.lines[0])
	if len(f) < 3 || !bytes.EqualFold(f[2], []byte("FETCH")) {
		return 0, nil, false, nil
	}
	for i, lit := range r.lits {
		line := r.lines[i]
		item := bytes.TrimRight(bytes.TrimSuffix(line[:bytes.LastIndexByte(line, '{')], []byte("~")), " ")
		if len(item) >= 6 && bytes.EqualFold(item[len(item)-6:], []byte("BODY[]")) {
			body, ok = lit, true
		}
	}
	if !ok {
		return 0, nil, false, nil
	}
	for _, line := range r.lines {
		toks := bytes.FieldsFunc(line, func(c rune) bool { return c == ' ' || c == '(' || c == ')' })
		for k := 0; k+1 < len(toks); k++ {
			if bytes.EqualFold(toks[k], []byte("UID")) {
				v, err := strconv.ParseUint(string(toks[k+1]), 10, 32)
				if err == nil && v > 0 {
					return uint32(v), body, true, nil
				}
			}
		}
	}
	return 0, nil, false, fmt.Errorf("%w: FETCH body without UID: %q", ErrProtocol, r.lines[0])
}

// uidSet formats uids as a compact IMAP sequence set ("3:5,9").
func uidSet(uids []uint32) string {
	s := slices.Clone(uids)
	slices.Sort(s)
	s = slices.Compact(s)
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(s[i]), 10))
		if j > i {
			b.WriteByte(':')
			b.WriteString(strconv.FormatUint(uint64(s[j]), 10))
		}
		i = j + 1
	}
	return b.String()
}

// imapQuote returns s as an IMAP quoted string (RFC 9051 section 4.3);
// CR, LF and NUL cannot be quoted.
func imapQuote(s string) (string, error) {
	if strings.ContainsAny(s, "\r\n\x00") {
		return "", fmt.Errorf("loadgen: IMAP login: user or password contains CR, LF or NUL")
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String(), nil
}

// hasPrefixFold reports whether b starts with the ASCII prefix p, ignoring
// case.
func hasPrefixFold(b []byte, p string) bool {
	return len(b) >= len(p) && bytes.EqualFold(b[:len(p)], []byte(p))
}
