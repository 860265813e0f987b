package imap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The decoder reads one command (RFC 9051 section 2.2.1, grammar in
// section 9) from a source that yields lines, with literals between them.
// Handlers pull the arguments they expect (atom, astring, list, ...); a
// command is complete when end succeeds.
//
// Bounds: each line is bounded by the source (textconn's MaxLine); a
// literal by maxLiteral (APPEND passes its own limit to literalReader);
// the literals of one command by maxLiterals; list nesting by maxDepth.
// Every bound fails the command with a *protoError carrying the response
// code, after which discard resynchronises with the client.

// source is where a decoder reads: lines, the raw reader for literal
// octets, and the continuation request of a synchronizing literal.
type source interface {
	ReadLine() ([]byte, error)
	Reader() *bufio.Reader
	// Continue sends "+ text" and flushes (RFC 9051 section 7.5).
	Continue(text string) error
}

// protoError is a refusal of the command as sent: BAD (syntax, bounds)
// or NO, with an optional response code. Its text never echoes client input
// beyond what the client may see of its own command.
type protoError struct {
	no   bool   // NO rather than BAD
	bye  bool   // no tagged response: an untagged BYE, and the connection closes
	code string // response code without brackets, e.g. "TOOBIG"
	text string
}

func (e *protoError) Error() string { return "imap: " + e.text }

func syntaxErr(format string, args ...any) error {
	return &protoError{text: fmt.Sprintf(format, args...)}
}

// Decoder limits.
const (
	// DefaultMaxLiteral bounds a literal in any command but APPEND.
	DefaultMaxLiteral = 64 << 10
	// DefaultMaxLiterals bounds the literals of one command (MULTIAPPEND
	// included).
	DefaultMaxLiterals = 1000
	// maxDepth bounds parenthesized list nesting (search keys, body
	// sections).
	maxDepth = 16
	// maxDiscard is the largest non-synchronizing literal the server reads
	// and drops to stay in step after refusing it; beyond it the
	// connection is closed.
	maxDiscard = 64 << 20
)

// errConnection wraps an I/O error of the source: the session cannot go on.
type errConnection struct{ err error }

func (e errConnection) Error() string { return "imap: connection: " + e.err.Error() }
func (e errConnection) Unwrap() error { return e.err }

// errResync means the client sent a non-synchronizing literal too large to
// skip: the connection must close.
var errResync = errors.New("imap: cannot resynchronise after oversized literal")

type decoder struct {
	src         source
	line        []byte // unread rest of the current line
	maxLiteral  int64
	maxLiterals int
	literals    int
	depth       int
	// pending is the length of a refused non-synchronizing literal the
	// client is sending anyway; discard drops it.
	pending int64
	// utf7 makes mailbox and listMailbox decode modified UTF-7 (an
	// IMAP4rev1 session, utf7.go); otherwise they require UTF-8.
	utf7 bool
}

func newDecoder(src source, line []byte, maxLiteral int64, maxLiterals int) *decoder {
	return &decoder{src: src, line: line, maxLiteral: maxLiteral, maxLiterals: maxLiterals}
}

func (d *decoder) eol() bool { return len(d.line) == 0 }

func (d *decoder) peek() byte {
	if len(d.line) == 0 {
		return 0
	}
	return d.line[0]
}

func (d *decoder) accept(c byte) bool {
	if len(d.line) > 0 && d.line[0] == c {
		d.line = d.line[1:]
		return true
	}
	return false
}

func (d *decoder) expect(c byte) error {
	if !d.accept(c) {
		if c == ' ' {
			return syntaxErr("expected SP")
		}
		return syntaxErr("expected %q", c)
	}
	return nil
}

func (d *decoder) sp() error { return d.expect(' ') }

// end succeeds when the command is complete.
func (d *decoder) end() error {
	if !d.eol() {
		return syntaxErr("unexpected characters at end of command")
	}
	return nil
}

// isAtomChar: ATOM-CHAR, any CHAR except atom-specials (RFC 9051 section 9).
func isAtomChar(c byte) bool {
	if c <= 0x1f || c >= 0x7f {
		return false
	}
	switch c {
	case '(', ')', '{', ' ', '%', '*', '"', '\\', ']':
		return false
	}
	return true
}

// atom reads 1*ATOM-CHAR; extra admits further characters (']' for
// ASTRING-CHAR, '\\' and '*' for flags, '%' '*' for list-mailbox).
func (d *decoder) atom(extra string) (string, error) {
	i := 0
	for i < len(d.line) && (isAtomChar(d.line[i]) || strings.IndexByte(extra, d.line[i]) >= 0) {
		i++
	}
	if i == 0 {
		return "", syntaxErr("expected atom")
	}
	s := string(d.line[:i])
	d.line = d.line[i:]
	return s, nil
}

// quoted reads a quoted string (RFC 9051 section 4.3: "\" and DQUOTE
// escaped, no CR/LF).
func (d *decoder) quoted() (string, error) {
	if err := d.expect('"'); err != nil {
		return "", err
	}
	var b []byte
	for i := 0; i < len(d.line); i++ {
		c := d.line[i]
		switch c {
		case '"':
			if b == nil {
				b = d.line[:i]
			}
			s := string(b)
			d.line = d.line[i+1:]
			return s, nil
		case '\\':
			if b == nil {
				b = append([]byte(nil), d.line[:i]...)
			}
			i++
			if i == len(d.line) || (d.line[i] != '"' && d.line[i] != '\\') {
				return "", syntaxErr("bad escape in quoted string")
			}
			b = append(b, d.line[i])
		case 0:
			return "", syntaxErr("NUL in quoted string")
		default:
			if b != nil {
				b = append(b, c)
			}
		}
	}
	return "", syntaxErr("unterminated quoted string")
}

// literalHeader parses "{n}" or "{n+}" (RFC 7888) ending the line.
func (d *decoder) literalHeader() (n int64, sync bool, err error) {
	if err := d.expect('{'); err != nil {
		return 0, false, err
	}
	i := 0
	for i < len(d.line) && d.line[i] >= '0' && d.line[i] <= '9' {
		i++
	}
	if i == 0 || i > 19 {
		return 0, false, syntaxErr("bad literal length")
	}
	n, perr := strconv.ParseInt(string(d.line[:i]), 10, 64)
	if perr != nil {
		return 0, false, syntaxErr("bad literal length")
	}
	d.line = d.line[i:]
	sync = !d.accept('+')
	if !d.accept('}') || !d.eol() {
		return 0, false, syntaxErr("literal must end the line")
	}
	return n, sync, nil
}

// literalReader parses a literal header and returns a reader over its n
// octets, bounded by limit (a larger literal fails with TOOBIG; tooBigNO
// makes that a NO, as APPEND's is). For a synchronizing literal it sends
// the continuation request first. The caller must read the literal to its
// end and call next.
func (d *decoder) literalReader(limit int64, tooBigNO bool) (io.Reader, int64, error) {
	n, sync, err := d.literalHeader()
	if err != nil {
		return nil, 0, err
	}
	d.literals++
	if d.literals > d.maxLiterals {
		if !sync {
			d.pending = n
		}
		return nil, 0, &protoError{code: "LIMIT", text: "too many literals in one command"}
	}
	if n > limit {
		if !sync {
			d.pending = n
		}
		return nil, 0, &protoError{no: tooBigNO, code: "TOOBIG", text: "literal too large"}
	}
	if sync {
		if err := d.src.Continue("Ready for literal data"); err != nil {
			return nil, 0, errConnection{err}
		}
	}
	return io.LimitReader(d.src.Reader(), n), n, nil
}

// next reads the line that follows a literal.
func (d *decoder) next() error {
	line, err := d.src.ReadLine()
	if err != nil {
		return errConnection{err}
	}
	d.line = line
	return nil
}

// literal reads a whole literal into memory (bounded by maxLiteral).
func (d *decoder) literal() (string, error) {
	r, n, err := d.literalReader(d.maxLiteral, false)
	if err != nil {
		return "", err
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return "", errConnection{err}
	}
	if err := d.next(); err != nil {
		return "", err
	}
	return string(buf), nil
}

// str reads a string: quoted or literal.
func (d *decoder) str() (string, error) {
	switch d.peek() {
	case '"':
		return d.quoted()
	case '{':
		return d.literal()
	}
	return "", syntaxErr("expected string")
}

// astring reads an astring: atom (with ']'), quoted or literal.
func (d *decoder) astring() (string, error) {
	switch d.peek() {
	case '"', '{':
		return d.str()
	}
	return d.atom("]")
}

// nstring reads NIL or a string; ok is false for NIL.
func (d *decoder) nstring() (s string, ok bool, err error) {
	switch d.peek() {
	case '"', '{':
		s, err = d.str()
		return s, err == nil, err
	}
	a, err := d.atom("")
	if err != nil {
		return "", false, err
	}
	if !strings.EqualFold(a, "NIL") {
		return "", false, syntaxErr("expected string or NIL")
	}
	return "", false, nil
}

// mailbox reads a mailbox name (RFC 9051 section 9: astring, with INBOX
// case-insensitive; the caller canonicalises) and returns its UTF-8 form.
func (d *decoder) mailbox() (string, error) {
	s, err := d.astring()
	if err != nil {
		return "", err
	}
	return d.mailboxText(s)
}

// listMailbox reads a LIST pattern: list-char atom (with % * ]) or string,
// converted as mailbox converts names.
func (d *decoder) listMailbox() (string, error) {
	var s string
	var err error
	switch d.peek() {
	case '"', '{':
		s, err = d.str()
	default:
		s, err = d.atom("%*]")
	}
	if err != nil {
		return "", err
	}
	return d.mailboxText(s)
}

// mailboxText converts a name or pattern as sent to UTF-8: modified UTF-7
// in an IMAP4rev1 session (RFC 3501 section 5.1.3), UTF-8 as it stands in
// an IMAP4rev2 one (RFC 9051 section 5.1). Anything else is BAD.
func (d *decoder) mailboxText(s string) (string, error) {
	if d.utf7 {
		u, err := decodeMUTF7(s)
		if err != nil {
			return "", syntaxErr("mailbox name is not valid modified UTF-7")
		}
		return u, nil
	}
	if !utf8.ValidString(s) {
		return "", syntaxErr("mailbox name is not UTF-8")
	}
	return s, nil
}

// list reads "(" [item *(SP item)] ")", calling item for each element.
func (d *decoder) list(item func() error) error {
	if err := d.expect('('); err != nil {
		return err
	}
	d.depth++
	defer func() { d.depth-- }()
	if d.depth > maxDepth {
		return &protoError{code: "LIMIT", text: "lists nested too deeply"}
	}
	if d.accept(')') {
		return nil
	}
	for {
		if err := item(); err != nil {
			return err
		}
		if d.accept(')') {
			return nil
		}
		if err := d.sp(); err != nil {
			return syntaxErr("expected SP or ')' in list")
		}
	}
}

// number reads a number (RFC 9051 section 9: 32-bit unsigned).
func (d *decoder) number() (uint32, error) {
	n, err := d.number64()
	if err != nil {
		return 0, err
	}
	if n > 1<<32-1 {
		return 0, syntaxErr("number out of range")
	}
	return uint32(n), nil
}

// number64 reads a number64 (RFC 9051: up to 2^63-1).
func (d *decoder) number64() (uint64, error) {
	i := 0
	for i < len(d.line) && d.line[i] >= '0' && d.line[i] <= '9' {
		i++
	}
	if i == 0 || i > 19 {
		return 0, syntaxErr("expected number")
	}
	n, err := strconv.ParseUint(string(d.line[:i]), 10, 63)
	if err != nil {
		return 0, syntaxErr("number out of range")
	}
	d.line = d.line[i:]
	return n, nil
}

// flag reads a flag: "\" atom or atom (RFC 9051 section 9, flag).
func (d *decoder) flag() (string, error) {
	if d.accept('\\') {
		a, err := d.atom("")
		if err != nil {
			return "", err
		}
		return canonicalFlag(`\` + a), nil
	}
	return d.atom("")
}

// flagList reads "(" [flag *(SP flag)] ")".
func (d *decoder) flagList() ([]string, error) {
	var flags []string
	err := d.list(func() error {
		f, err := d.flag()
		flags = append(flags, f)
		return err
	})
	return flags, err
}

// canonicalFlag spells system flags as RFC 9051 section 2.3.2 does; flag
// names are case-insensitive.
func canonicalFlag(f string) string {
	for _, s := range [...]string{`\Seen`, `\Answered`, `\Flagged`, `\Deleted`, `\Draft`, `\Recent`} {
		if strings.EqualFold(f, s) {
			return s
		}
	}
	return f
}

// seqSet reads a sequence-set (RFC 9051 section 9) or "$" (RFC 5182).
func (d *decoder) seqSet() (SeqSet, error) {
	if d.accept('$') {
		return SeqSet{Saved: true}, nil
	}
	var s SeqSet
	for {
		lo, err := d.seqNumber()
		if err != nil {
			return s, err
		}
		hi := lo
		if d.accept(':') {
			if hi, err = d.seqNumber(); err != nil {
				return s, err
			}
		}
		if len(s.Ranges) >= maxSeqRanges {
			return s, &protoError{code: "LIMIT", text: "sequence set too long"}
		}
		s.Ranges = append(s.Ranges, SeqRange{lo, hi})
		if !d.accept(',') {
			return s, nil
		}
	}
}

const maxSeqRanges = 100_000

func (d *decoder) seqNumber() (uint32, error) {
	if d.accept('*') {
		return 0, nil
	}
	n, err := d.number()
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, syntaxErr("sequence number 0")
	}
	return n, nil
}

// discard skips what remains of a refused command so that the next line
// read is the next command. Non-synchronizing literals the client sends
// without waiting are read and dropped (up to maxDiscard); a
// synchronizing one is never sent, because no continuation was.
func (d *decoder) discard() error {
	for {
		if d.pending > 0 {
			if d.pending > maxDiscard {
				return errResync
			}
			if _, err := io.CopyN(io.Discard, d.src.Reader(), d.pending); err != nil {
				return errConnection{err}
			}
			d.pending = 0
			if err := d.next(); err != nil {
				return err
			}
			continue
		}
		i := bytes.LastIndexByte(d.line, '{')
		if i < 0 || !bytes.HasSuffix(d.line, []byte("+}")) {
			d.line = nil
			return nil
		}
		n, err := strconv.ParseInt(string(d.line[i+1:len(d.line)-2]), 10, 64)
		if err != nil || n < 0 {
			d.line = nil
			return nil
		}
		d.line = nil
		d.pending = n
	}
}
