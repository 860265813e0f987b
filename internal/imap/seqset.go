package imap

import (
	"slices"
	"strconv"
)

// SeqRange is one range of a sequence set; 0 stands for "*", the largest
// number in use (RFC 9051 section 9, seq-number).
type SeqRange struct{ Lo, Hi uint32 }

// SeqSet is a sequence-set of message sequence numbers or UIDs, or "$",
// the saved search result (RFC 5182).
type SeqSet struct {
	Ranges []SeqRange
	Saved  bool
}

// String renders s in the wire form.
func (s SeqSet) String() string {
	if s.Saved {
		return "$"
	}
	var b []byte
	for i, r := range s.Ranges {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendSeqNum(b, r.Lo)
		if r.Hi != r.Lo {
			b = append(b, ':')
			b = appendSeqNum(b, r.Hi)
		}
	}
	return string(b)
}

func appendSeqNum(b []byte, n uint32) []byte {
	if n == 0 {
		return append(b, '*')
	}
	return strconv.AppendUint(b, uint64(n), 10)
}

// bounds returns r's range with "*" replaced by star, ordered (RFC 9051:
// "2:4" and "4:2" are the same).
func (r SeqRange) bounds(star uint32) (lo, hi uint32) {
	lo, hi = r.Lo, r.Hi
	if lo == 0 {
		lo = star
	}
	if hi == 0 {
		hi = star
	}
	if lo > hi {
		lo, hi = hi, lo
	}
	return lo, hi
}

// uidsBySeq resolves a set of sequence numbers against a mailbox of n
// messages whose UIDs uid(seq) gives. ok is false if a number is out of
// range (RFC 9051 section 6.4.4: a BAD).
func uidsBySeq(s SeqSet, n uint32, uid func(uint32) uint32) (uids []uint32, ok bool) {
	for _, r := range s.Ranges {
		lo, hi := r.bounds(n)
		if lo == 0 || hi > n {
			return nil, false
		}
		for seq := lo; seq <= hi; seq++ {
			uids = append(uids, uid(seq))
		}
	}
	return sortUnique(uids), true
}

// uidsByUID resolves a set of UIDs against the UIDs known (ascending);
// UIDs not present are ignored (RFC 9051 section 6.4.9), and "*" is the
// largest known UID (so "N:*" includes it even when N is above it).
func uidsByUID(s SeqSet, known []uint32) []uint32 {
	if len(known) == 0 {
		return nil
	}
	star := known[len(known)-1]
	var uids []uint32
	for _, r := range s.Ranges {
		lo, hi := r.bounds(star)
		i, _ := slices.BinarySearch(known, lo)
		for ; i < len(known) && known[i] <= hi; i++ {
			uids = append(uids, known[i])
		}
	}
	return sortUnique(uids)
}

func sortUnique(u []uint32) []uint32 {
	if !slices.IsSorted(u) {
		slices.Sort(u)
	}
	return slices.Compact(u)
}
