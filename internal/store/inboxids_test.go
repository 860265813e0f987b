package store

import (
	"strconv"
	"testing"
)

func TestInboxIDsAreBounded(t *testing.T) {
	const max = 1000
	c := NewInboxIDs(max)
	id := func(i int) ID { var x ID; x[0], x[1] = byte(i), byte(i>>8); return x }
	for i := range max + 100 {
		c.Put(strconv.Itoa(i), id(i))
		if got, ok := c.Get(strconv.Itoa(i)); !ok || got != id(i) {
			t.Fatalf("entry %d just put: %v, %v", i, got, ok)
		}
	}
	if c.Len() != max {
		t.Errorf("%d entries, want the bound %d", c.Len(), max)
	}
	last := strconv.Itoa(max + 99)
	c.Forget(last)
	if _, ok := c.Get(last); ok {
		t.Error("a forgotten entry is still served")
	}
	c.Put("new", id(1)) // room again: nothing displaced
	if c.Len() != max {
		t.Errorf("after a forget and a put: %d entries, want %d", c.Len(), max)
	}
	c.Put("new", id(2)) // a known key displaces nothing
	if got, _ := c.Get("new"); got != id(2) || c.Len() != max {
		t.Errorf("rewriting an entry: %v, %d entries", got, c.Len())
	}
}
