package mailbox

import (
	"slices"
	"testing"

	"quill/internal/store"
)

type watchLog []string

func (w *watchLog) Watch(id store.ID)   { *w = append(*w, "+"+id.String()) }
func (w *watchLog) Unwatch(id store.ID) { *w = append(*w, "-"+id.String()) }

// The hub's watcher hears the mailboxes already subscribed when it starts
// observing, then each mailbox's first subscriber and its last leaving,
// never the ones between.
func TestHubWatcher(t *testing.T) {
	h := NewHub()
	a, b := store.NewID(), store.NewID()
	_, cancelA := h.Subscribe(a)
	var w watchLog
	h.Observe(&w)
	_, cancelB1 := h.Subscribe(b)
	_, cancelB2 := h.Subscribe(b)
	cancelB1()
	cancelB1() // a second call changes nothing
	cancelA()
	cancelB2()
	want := watchLog{"+" + a.String(), "+" + b.String(), "-" + a.String(), "-" + b.String()}
	if !slices.Equal(w, want) {
		t.Fatalf("watcher heard %v, want %v", w, want)
	}
}
