package overlay

import (
	"fmt"
	"strings"
)

// Schema tells an overlay which iterations a key concerns, by the key's
// table, its first byte: the overlay indexes its writes by it, so that
// Touches and Snapshot find the writes an iteration could see without
// looking at the others. The engine owns the key layout; this table is all
// the overlay knows of it. In the zero Schema every table is "other".
//
// A table is one of:
//   - a span table (Spans): each key names a span, the records an
//     iteration reads together through Snapshot;
//   - a user table (ByUser): its keys are iterated per user;
//   - untracked (Untracked): nothing iterates it without a checkpoint
//     first, so its writes never make Touches report anything;
//   - other: Touches of a prefix in it (or in a span or user table, but
//     too short to name a span or a user) reports whether the overlay
//     holds a write to any other table.
type Schema struct {
	tables [256]table
}

type table struct {
	kind  uint8
	group byte  // span tables: the group of the span a key names
	n     uint8 // span tables: the length of the span's id
}

const (
	kindOther uint8 = iota
	kindSpan
	kindUser
	kindUntracked
)

// maxSpanID bounds a span's id: a mailbox ID, 16 bytes.
const maxSpanID = 16

// Span names records that are iterated together: the group Schema.Spans
// gave their tables, and an id of up to 16 bytes.
type Span struct {
	group byte
	id    [maxSpanID]byte
}

// MakeSpan returns the span that Schema.Spans(group, len(id), ...) puts a
// key in whose bytes after its table byte start with id.
func MakeSpan(group byte, id []byte) Span {
	s := Span{group: group}
	copy(s.id[:], id)
	return s
}

// Spans makes tables span tables: a key of one of them at least 1+n bytes
// long is in the span of group and the n bytes after its table byte, so
// that tables sharing a group and an id share a span. Shorter keys, and
// prefixes shorter than that, are other.
func (s *Schema) Spans(group byte, n int, tables ...byte) {
	if n < 0 || n > maxSpanID {
		panic(fmt.Sprintf("overlay: span id of %d bytes", n))
	}
	for _, t := range tables {
		s.tables[t] = table{kind: kindSpan, group: group, n: uint8(n)}
	}
}

// ByUser makes tables user tables: a key's user is what follows its table
// byte up to the first 0 byte or the end.
func (s *Schema) ByUser(tables ...byte) {
	for _, t := range tables {
		s.tables[t] = table{kind: kindUser}
	}
}

// Untracked makes tables untracked: their writes make Touches report
// nothing, since nothing iterates them without a checkpoint first (the
// engine's Check settles regardless). Touches of a prefix in one of them
// answers as for an other table.
func (s *Schema) Untracked(tables ...byte) {
	for _, t := range tables {
		s.tables[t] = table{kind: kindUntracked}
	}
}

// spanOf returns the span k is in, if k is a key or prefix of a span table
// long enough to name one.
func spanOf[K string | []byte](s *Schema, k K) (Span, bool) {
	if len(k) == 0 {
		return Span{}, false
	}
	t := s.tables[k[0]]
	if t.kind != kindSpan || len(k) < 1+int(t.n) {
		return Span{}, false
	}
	sp := Span{group: t.group}
	copy(sp.id[:t.n], k[1:])
	return sp, true
}

// isUser reports whether k is in a user table.
func (s *Schema) isUser(k []byte) bool { return s.tables[k[0]].kind == kindUser }

// userOf returns the user of a user table's prefix or key.
func userOf(p string) string {
	if i := strings.IndexByte(p[1:], 0); i >= 0 {
		return p[1 : 1+i]
	}
	return p[1:]
}
