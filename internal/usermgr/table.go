package usermgr

// table is an open-addressing hash set of users with linear probing and
// backward-shift deletion. Each user is filed under the hash key returns for
// it, which must not change while the user is in the table; lookups match
// entries with a predicate. It keeps one pointer per slot and at most 7/8
// of its slots full: 9 to 18 bytes per entry, where a Go map from a string
// or an ID to a pointer takes 35 to 70 (the soft state per active user is a
// budget: BenchmarkSoftStatePerUser). Not safe for concurrent use.
type table struct {
	slots []*user
	n     int
	key   func(*user) uint64
}

// find returns the user filed under hash h for which eq holds, or nil.
func (t *table) find(h uint64, eq func(*user) bool) *user {
	if t.n == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		u := t.slots[i]
		if u == nil {
			return nil
		}
		if eq(u) {
			return u
		}
	}
}

// add files u, which must not be in the table.
func (t *table) add(u *user) {
	if (t.n+1)*8 > len(t.slots)*7 {
		t.grow()
	}
	t.place(u)
	t.n++
}

func (t *table) place(u *user) {
	mask := uint64(len(t.slots) - 1)
	i := t.key(u) & mask
	for t.slots[i] != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = u
}

func (t *table) grow() {
	old := t.slots
	t.slots = make([]*user, max(16, 2*len(old)))
	for _, u := range old {
		if u != nil {
			t.place(u)
		}
	}
}

// remove takes u out of the table, if it is there, moving back the
// entries after it that their hash lets move, so that no probe sequence
// has a hole.
func (t *table) remove(u *user) {
	if t.n == 0 {
		return
	}
	mask := uint64(len(t.slots) - 1)
	i := t.key(u) & mask
	for t.slots[i] != u {
		if t.slots[i] == nil {
			return
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; t.slots[j] != nil; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home slot k
		// lies cyclically in (i, j].
		k := t.key(t.slots[j]) & mask
		if (i < j && i < k && k <= j) || (i > j && (k > i || k <= j)) {
			continue
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = nil
	t.n--
}

// each calls fn for the entries from slot start on, wrapping around,
// until fn returns false. fn must not change the table.
func (t *table) each(start int, fn func(*user) bool) {
	if len(t.slots) == 0 {
		return
	}
	for n := range len(t.slots) {
		if u := t.slots[(start+n)%len(t.slots)]; u != nil && !fn(u) {
			return
		}
	}
}
