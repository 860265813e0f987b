package usermgr

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The table agrees with a Go map through random adds and removes, under a
// hash with few values, so that probe runs are long, wrap around the end
// of the slots, and are shifted back on removal.
func TestTableAgreesWithMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, buckets := range []uint64{1, 3, 64, 1 << 40} {
		t.Run(fmt.Sprint(buckets), func(t *testing.T) {
			hash := map[*user]uint64{}
			tab := table{key: func(u *user) uint64 { return hash[u] }}
			in := map[string]*user{}
			var all []*user
			for i := range 400 {
				u := &user{name: fmt.Sprint("u", i)}
				// High hashes wrap: their home slot is near the end.
				hash[u] = ^uint64(0) - rng.Uint64N(buckets)
				all = append(all, u)
			}
			for step := range 20000 {
				u := all[rng.IntN(len(all))]
				if in[u.name] != nil {
					tab.remove(u)
					delete(in, u.name)
				} else {
					tab.add(u)
					in[u.name] = u
				}
				if tab.n != len(in) {
					t.Fatalf("step %d: %d entries, want %d", step, tab.n, len(in))
				}
				if tab.n*8 > len(tab.slots)*7 {
					t.Fatalf("step %d: %d entries in %d slots", step, tab.n, len(tab.slots))
				}
				if step%97 != 0 {
					continue
				}
				for _, v := range all {
					got := tab.find(hash[v], func(w *user) bool { return w.name == v.name })
					if got != in[v.name] {
						t.Fatalf("step %d: find(%s) = %v, want %v", step, v.name, got, in[v.name])
					}
				}
				seen := 0
				tab.each(rng.IntN(len(tab.slots)+1), func(*user) bool { seen++; return true })
				if seen != len(in) {
					t.Fatalf("step %d: each saw %d, want %d", step, seen, len(in))
				}
			}
		})
	}
}
