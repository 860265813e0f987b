package overlay

import (
	"bytes"

	"github.com/cockroachdb/pebble/v2"
)

// View iterates forward over Pebble's records with sorted writes above
// them: a write replaces the record at its key, or hides it when it is a
// deletion.
type View struct {
	it         *pebble.Iterator
	ov         []Write
	i          int
	itOK       bool
	key, value []byte
	fromOv     bool // the current record is ov[i]
	shadows    bool // ov[i] hides the iterator's current record
}

// NewView returns a view of it with ws, sorted by key (Snapshot,
// WithAbove), above it. Closing the view closes it.
func NewView(it *pebble.Iterator, ws []Write) *View { return &View{it: it, ov: ws} }

// First moves to the first record, and reports whether there is one.
func (v *View) First() bool {
	v.itOK, v.i = v.it.First(), 0
	return v.find()
}

// Next moves to the next record, and reports whether there is one.
func (v *View) Next() bool {
	if v.fromOv {
		v.i++
		if v.shadows {
			v.itOK = v.it.Next()
		}
	} else {
		v.itOK = v.it.Next()
	}
	return v.find()
}

func (v *View) find() bool {
	for {
		hasOv := v.i < len(v.ov)
		switch {
		case !v.itOK && !hasOv:
			return false
		case hasOv && (!v.itOK || bytes.Compare(v.ov[v.i].Key, v.it.Key()) <= 0):
			p := v.ov[v.i]
			shadows := v.itOK && bytes.Equal(p.Key, v.it.Key())
			if p.Del {
				v.i++
				if shadows {
					v.itOK = v.it.Next()
				}
				continue
			}
			v.key, v.value, v.fromOv, v.shadows = p.Key, p.Value, true, shadows
			return true
		default:
			v.key, v.value, v.fromOv = v.it.Key(), v.it.Value(), false
			return true
		}
	}
}

// Key returns the current record's key: valid until the next move, like
// the iterator's.
func (v *View) Key() []byte { return v.key }

// Value returns the current record's value, valid as Key's.
func (v *View) Value() []byte { return v.value }

// FromOverlay reports whether the current record is one of the writes
// above the iterator.
func (v *View) FromOverlay() bool { return v.fromOv }

// Writes returns the writes above the iterator.
func (v *View) Writes() []Write { return v.ov }

// Iter returns the iterator beneath the writes, for a caller that walks it
// alone once Writes is empty.
func (v *View) Iter() *pebble.Iterator { return v.it }

// Close releases the view's iterator.
func (v *View) Close() error { return v.it.Close() }

// Error reports the iterator's error.
func (v *View) Error() error { return v.it.Error() }

// WithAbove returns the sorted writes ws with the writes of above in
// [lo, hi) over them (a nil value in above is a deletion).
func WithAbove(ws []Write, above map[string][]byte, lo, hi []byte) []Write {
	var m map[string]Write
	for k, val := range above {
		if k < string(lo) || k >= string(hi) {
			continue
		}
		if m == nil {
			m = make(map[string]Write, len(ws))
			for _, p := range ws {
				m[string(p.Key)] = p
			}
		}
		m[k] = Write{Key: []byte(k), Value: val, Del: val == nil}
	}
	if m == nil {
		return ws
	}
	return sortedWrites(m)
}
