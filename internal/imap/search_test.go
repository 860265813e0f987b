package imap

import (
	"math/rand/v2"
	"slices"
	"testing"

	"quill/internal/mailbox"
)

// uidsView is a View of known UIDs only: enough for the UID and sequence
// keys, which never read a message.
type uidsView struct {
	View
	uids []uint32
}

func (v uidsView) UIDs() []uint32        { return v.uids }
func (v uidsView) Len() uint32           { return uint32(len(v.uids)) }
func (v uidsView) UID(seq uint32) uint32 { return v.uids[seq-1] }
func (v uidsView) MaxUID() uint32 {
	if len(v.uids) == 0 {
		return 0
	}
	return v.uids[len(v.uids)-1]
}

func TestSearchCandidates(t *testing.T) {
	s := &session{view: uidsView{uids: []uint32{2, 4, 5, 9, 10, 20}}, saved: []uint32{4, 7, 20}}
	set := func(r ...SeqRange) SeqSet { return SeqSet{Ranges: r} }
	uid := func(r ...SeqRange) searchKey { return searchKey{op: "UID", set: set(r...)} }
	seq := func(r ...SeqRange) searchKey { return searchKey{op: "SEQ", set: set(r...)} }
	for _, tc := range []struct {
		name string
		keys []searchKey
		want []uint32
	}{
		{"none", []searchKey{{op: "FLAG", flag: `\Seen`}}, []uint32{2, 4, 5, 9, 10, 20}},
		{"uid range", []searchKey{uid(SeqRange{4, 9})}, []uint32{4, 5, 9}},
		{"uid star beyond", []searchKey{uid(SeqRange{30, 0})}, []uint32{20}},
		{"seq star", []searchKey{seq(SeqRange{5, 0})}, []uint32{10, 20}},
		{"seq beyond", []searchKey{seq(SeqRange{5, 9})}, []uint32{10, 20}},
		{"seq all beyond", []searchKey{seq(SeqRange{7, 9})}, nil},
		{"intersection", []searchKey{uid(SeqRange{1, 10}), seq(SeqRange{3, 6})}, []uint32{5, 9, 10}},
		{"nested and", []searchKey{{op: "AND", sub: []searchKey{uid(SeqRange{9, 9}), {op: "ALL"}}}}, []uint32{9}},
		{"not does not restrict", []searchKey{{op: "NOT", sub: []searchKey{uid(SeqRange{9, 9})}}}, []uint32{2, 4, 5, 9, 10, 20}},
		{"saved", []searchKey{{op: "UID", set: SeqSet{Saved: true}}}, []uint32{4, 20}},
	} {
		if got := s.candidates(tc.keys); !slices.Equal(got, tc.want) {
			t.Errorf("%s: candidates = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSearchCandidatesSuperset checks the invariant the restriction relies
// on: every message that matches random criteria built from UID, sequence,
// NOT, OR and AND keys is among the candidates.
func TestSearchCandidatesSuperset(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	num := func(n uint32) uint32 { return uint32(r.IntN(int(n) + 3)) } // 0 is "*"
	rng := func(n uint32) SeqSet {
		var s SeqSet
		for range 1 + r.IntN(3) {
			s.Ranges = append(s.Ranges, SeqRange{num(n), num(n)})
		}
		if r.IntN(8) == 0 {
			s = SeqSet{Saved: true}
		}
		return s
	}
	var key func(depth int, n, top uint32) searchKey
	key = func(depth int, n, top uint32) searchKey {
		op := r.IntN(6)
		if depth > 3 {
			op %= 3
		}
		switch op {
		case 0:
			return searchKey{op: "UID", set: rng(top)}
		case 1:
			return searchKey{op: "SEQ", set: rng(n)}
		case 2:
			return searchKey{op: "ALL"}
		case 3:
			return searchKey{op: "NOT", sub: []searchKey{key(depth+1, n, top)}}
		case 4:
			return searchKey{op: "OR", sub: []searchKey{key(depth+1, n, top), key(depth+1, n, top)}}
		default:
			return searchKey{op: "AND", sub: []searchKey{key(depth+1, n, top), key(depth+1, n, top)}}
		}
	}
	for i := range 2000 {
		var uids []uint32
		for u := uint32(1); u < 40; u++ {
			if r.IntN(2) == 0 {
				uids = append(uids, u)
			}
		}
		var saved []uint32
		for range r.IntN(5) {
			saved = append(saved, uint32(1+r.IntN(45)))
		}
		s := &session{view: uidsView{uids: uids}, saved: saved}
		var keys []searchKey
		for range 1 + r.IntN(3) {
			keys = append(keys, key(0, uint32(len(uids)), 40))
		}
		cand := s.candidates(keys)
		for seq, u := range uids {
			ev := evaluator{s: s, m: mailbox.Message{UID: u, Seq: uint32(seq + 1)}}
			ok, err := ev.match(searchKey{op: "AND", sub: keys})
			if err != nil {
				t.Fatal(err)
			}
			if _, in := slices.BinarySearch(cand, u); ok && !in {
				t.Fatalf("case %d: UID %d matches %+v but is not among candidates %v (uids %v)", i, u, keys, cand, uids)
			}
		}
		if !slices.IsSorted(cand) || len(slices.Compact(slices.Clone(cand))) != len(cand) {
			t.Fatalf("case %d: candidates %v not ascending and unique", i, cand)
		}
	}
}
