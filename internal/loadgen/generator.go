// Package loadgen is Quill's load and durability client: it generates
// reproducible test messages, delivers them over persistent, pipelined SMTP
// connections while recording what the server acknowledged, and verifies
// afterwards (over POP3) that every acknowledged message is stored exactly
// once and byte-exact.
//
// It shares the machine with the server under test, so the hot path does not
// allocate per message beyond the optional Record: each worker owns its
// generator, buffers and connection, and there is no goroutine per message.
package loadgen

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// IDHeader is the header field that carries a generated message's unique id.
const IDHeader = "X-Quill-Load-Id"

// SizeDist chooses the size of a message. Implementations draw only from r so
// that a message stays a pure function of (seed, sequence number).
type SizeDist interface {
	Size(r *rand.Rand) int
}

// FixedSize gives every message the same size in octets.
type FixedSize int

// Size implements SizeDist.
func (s FixedSize) Size(*rand.Rand) int { return int(s) }

// RecipientPicker chooses the recipients of a message, appending them to dst
// and returning it. It must return at least one recipient, draw only from r,
// and return strings it retains (they are recorded, not copied).
type RecipientPicker interface {
	Pick(r *rand.Rand, dst []string) []string
}

// Uniform picks one recipient uniformly at random from Users.
type Uniform struct {
	Users []string
}

// Pick implements RecipientPicker.
func (u Uniform) Pick(r *rand.Rand, dst []string) []string {
	return append(dst, u.Users[r.IntN(len(u.Users))])
}

// UserNames returns the conventional load-test mailbox names user0000@domain
// through user(n-1)@domain. The caller provisions the accounts.
func UserNames(domain string, n int) []string {
	users := make([]string, n)
	for i := range users {
		users[i] = fmt.Sprintf("user%04d@%s", i, domain)
	}
	return users
}

// Spec describes the messages a Generator produces.
type Spec struct {
	// Seed makes the run reproducible: message seq is determined by
	// (Seed, seq) apart from its Date field.
	Seed uint64
	// RunID prefixes every message id so that runs sharing mailboxes can be
	// told apart. It must be a dot-atom-text token (letters, digits, '-').
	RunID string
	// From is the author address, also used as the envelope sender.
	From  string
	Sizes SizeDist
	Rcpts RecipientPicker
	// Now stamps the Date field; time.Now when nil.
	Now func() time.Time
}

// Validate reports whether s can generate messages.
func (s Spec) Validate() error {
	switch {
	case s.RunID == "":
		return fmt.Errorf("loadgen: empty RunID")
	case s.From == "":
		return fmt.Errorf("loadgen: empty From")
	case s.Sizes == nil:
		return fmt.Errorf("loadgen: no size distribution")
	case s.Rcpts == nil:
		return fmt.Errorf("loadgen: no recipient picker")
	}
	for i := 0; i < len(s.RunID); i++ {
		c := s.RunID[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("loadgen: RunID %q: only letters, digits and '-' allowed", s.RunID)
		}
	}
	return nil
}

// Message is one generated message. It is owned by the Generator that made
// it and valid only until that Generator's next call to Next.
type Message struct {
	Seq   uint64
	Rcpts []string
	// Data is the message exactly as the server should store it (before
	// the server prepends its trace fields): CRLF line ends, no
	// dot-stuffing, every line at most 78 octets, ending in CRLF.
	Data []byte

	idStart, idEnd int // IDHeader's value within Data
}

// ID returns the message's unique id (the value of IDHeader). It allocates.
func (m *Message) ID() string { return string(m.Data[m.idStart:m.idEnd]) }

// Sum returns the SHA-256 of Data. It is computed on demand: only a run
// that keeps a ledger to verify needs it, and hashing every message cost
// the mix's generator 4.5% of its CPU.
func (m *Message) Sum() [sha256.Size]byte { return sha256.Sum256(m.Data) }

// Generator produces messages from a Spec. It is not safe for concurrent
// use: give each worker its own.
type Generator struct {
	spec  Spec
	pcg   rand.PCG
	rng   *rand.Rand
	msg   Message
	buf   []byte
	rcpts []string
}

// NewGenerator returns a Generator for spec.
func NewGenerator(spec Spec) (*Generator, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Now == nil {
		spec.Now = time.Now
	}
	g := &Generator{spec: spec}
	g.rng = rand.New(&g.pcg)
	return g, nil
}

// bodyLineLen is the length of a full body line without its CRLF; 76 keeps
// lines well inside RFC 5322's 78-octet recommendation.
const bodyLineLen = 76

// dotLineOdds: one body line in dotLineOdds starts with '.', so that every
// message of a few KB exercises dot-stuffing (RFC 5321 section 4.5.2).
const dotLineOdds = 16

// Next generates message seq. The returned Message is reused by the next
// call. A size smaller than the header section yields a message with an
// empty body; a body of exactly one octet cannot end in CRLF and is grown
// to two.
func (g *Generator) Next(seq uint64) *Message {
	g.pcg.Seed(g.spec.Seed, seq)
	g.rcpts = g.spec.Rcpts.Pick(g.rng, g.rcpts[:0])
	size := g.spec.Sizes.Size(g.rng)

	b := g.buf[:0]
	b = append(b, "From: Quill Load <"...)
	b = append(b, g.spec.From...)
	b = append(b, ">\r\nTo: "...)
	for i, r := range g.rcpts {
		if i > 0 {
			b = append(b, ",\r\n "...) // fold: one recipient per line
		}
		b = append(b, '<')
		b = append(b, r...)
		b = append(b, '>')
	}
	b = append(b, "\r\nSubject: quill load "...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, "\r\nDate: "...)
	b = g.spec.Now().AppendFormat(b, time.RFC1123Z)
	b = append(b, "\r\nMessage-ID: <"...)
	idStart := len(b)
	b = append(b, g.spec.RunID...)
	b = append(b, '.')
	b = strconv.AppendUint(b, seq, 10)
	idEnd := len(b)
	b = append(b, "@quill-load.invalid>\r\n"...)
	b = append(b, IDHeader...)
	b = append(b, ": "...)
	b = append(b, b[idStart:idEnd]...)
	idEnd2 := len(b)
	idStart2 := idEnd2 - (idEnd - idStart)
	b = append(b, "\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n"...)

	bodyLen := max(size-len(b), 0)
	if bodyLen == 1 {
		bodyLen = 2
	}
	b = g.appendBody(b, bodyLen)

	g.buf = b
	g.msg = Message{
		Seq:     seq,
		Rcpts:   g.rcpts,
		Data:    b,
		idStart: idStart2,
		idEnd:   idEnd2,
	}
	return &g.msg
}

const bodyAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// appendBody appends exactly n octets (n != 1) of CRLF-terminated lines of
// pseudo-random printable ASCII drawn from g.rng.
func (g *Generator) appendBody(b []byte, n int) []byte {
	for n > 0 {
		l := min(n, bodyLineLen+2)
		if n-l == 1 {
			l-- // leave two octets for a final empty line, never one
		}
		text := l - 2
		start := len(b)
		b = append(b, make([]byte, l)...)
		line := b[start : start+text]
		for i := 0; i < text; {
			u := g.rng.Uint64()
			for j := 0; j < 10 && i < text; j++ {
				line[i] = bodyAlphabet[u&63]
				u >>= 6
				i++
			}
		}
		if text > 0 && g.rng.IntN(dotLineOdds) == 0 {
			line[0] = '.'
		}
		b[start+text], b[start+text+1] = '\r', '\n'
		n -= l
	}
	return b
}
