package usermap_test

import (
	"fmt"

	"quill/internal/cluster/usermap"
)

// A map of three nodes, one at half capacity and one draining, and what
// changes when the draining node comes back: it takes its 1638 buckets,
// and the quotas move about 160 more between the other two.
func ExampleNew() {
	view := []usermap.Member{
		{ID: "node-a", Weight: 100},
		{ID: "node-b", Weight: 50},
		{ID: "node-c", Weight: 100, Draining: true},
	}
	m, err := usermap.New(41, view)
	if err != nil {
		panic(err)
	}
	for _, id := range m.Nodes() {
		fmt.Println(id, len(m.Buckets(id)))
	}
	fmt.Println(m.OwnerOf("alice@example.com") == m.Owner(usermap.Bucket("Alice@Example.com")))

	view[2].Draining = false
	next, err := usermap.New(42, view)
	if err != nil {
		panic(err)
	}
	fmt.Println("epoch", next.Epoch(), "moves", len(usermap.Moves(m, next)))
	// Output:
	// node-a 2731
	// node-b 1365
	// true
	// epoch 42 moves 1799
}
