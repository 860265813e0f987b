package embedded

import (
	"testing"

	"quill/internal/store"
	"quill/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		e, err := Open(t.TempDir(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}
