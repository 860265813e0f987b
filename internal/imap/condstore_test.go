package imap

import (
	"math/rand/v2"
	"slices"
	"testing"

	"quill/internal/mailbox"
)

// TestIntersectRanges checks the known-uids cut of VANISHED (EARLIER)
// against membership UID by UID, over random sets with "*", overlaps and
// reversed ranges.
func TestIntersectRanges(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const top = 60
	for range 2000 {
		var uids []uint32
		for u := uint32(1); u <= top; u++ {
			if r.IntN(3) == 0 {
				uids = append(uids, u)
			}
		}
		var set SeqSet
		for range 1 + r.IntN(4) {
			lo, hi := uint32(r.IntN(top+1)), uint32(r.IntN(top+1)) // 0 is "*"
			set.Ranges = append(set.Ranges, SeqRange{lo, hi})
		}
		star := uint32(1 + r.IntN(top))
		var want []uint32
		for _, u := range uids {
			for _, sr := range set.Ranges {
				if lo, hi := sr.bounds(star); u >= lo && u <= hi {
					want = append(want, u)
					break
				}
			}
		}
		got := intersectRanges(mailbox.RangesOf(uids), normalize(set, star))
		if w := mailbox.RangesOf(want); !slices.Equal(got, w) {
			t.Fatalf("%v within %s (* = %d): got %v, want %v", uids, set, star, got, w)
		}
	}
}
