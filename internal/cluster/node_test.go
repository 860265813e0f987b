package cluster

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"quill/internal/cluster/credentials"
	"quill/internal/cluster/membership"
	"quill/internal/cluster/usermap"
	"quill/internal/load"
	"quill/internal/store"
	"quill/internal/store/embedded"
)

func openStore(t *testing.T) *embedded.Engine {
	t.Helper()
	e, err := embedded.Open(filepath.Join(t.TempDir(), "store"), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func startNode(t *testing.T, st credentials.Secrets, sessions int, join ...string) *Node {
	t.Helper()
	mon, err := load.Start(load.Options{Sessions: func() int { return sessions }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mon.Stop)
	n, err := Start(context.Background(), Options{
		DataDir: t.TempDir(), Addr: "127.0.0.1:0", Join: join, Secrets: st, Ownership: st.(store.Ownership), LeaseTerm: time.Second,
		Load: mon,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(context.Background()) })
	return n
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStartNeedsCredentials(t *testing.T) {
	st := openStore(t)
	_, err := Start(context.Background(), Options{DataDir: t.TempDir(), Addr: "127.0.0.1:0", Secrets: st, Ownership: st})
	if !errors.Is(err, credentials.ErrNotInitialized) {
		t.Fatalf("Start without credentials = %v, want ErrNotInitialized", err)
	}
}

// TestStatusAndDrain: three nodes on one store; any node's status lists
// all three alive with their loads and buckets summing to usermap.Buckets;
// draining one (through another) leaves it no buckets; a node that shuts
// down is listed dead and its buckets go to the others.
func TestStatusAndDrain(t *testing.T) {
	st := openStore(t)
	if _, _, err := credentials.Init(context.Background(), st, time.Now()); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, st, 3)
	b := startNode(t, st, 5, a.Addr())
	c := startNode(t, st, 7, a.Addr())
	sessions := map[string]int{a.ID(): 3, b.ID(): 5, c.ID(): 7}
	ctx := context.Background()

	check := func(from *Node, want map[string]membership.State) error {
		s := from.Status(ctx)
		if s.Self != from.ID() || s.Buckets != usermap.Buckets || len(s.Nodes) != len(want) {
			return errors.New("wrong node count or totals")
		}
		sum := 0
		for _, ns := range s.Nodes {
			if ns.State != want[ns.ID] {
				return errors.New("node " + ns.ID + " is " + string(ns.State) + ", want " + string(want[ns.ID]))
			}
			sum += ns.Buckets
			switch ns.State {
			case membership.Alive:
				if ns.Buckets == 0 {
					return errors.New("an alive node has no buckets")
				}
				if ns.Load == nil || ns.Load.Sessions != sessions[ns.ID] {
					return errors.New("load of " + ns.ID + " missing or wrong: " + ns.Error)
				}
			case membership.Draining, membership.Dead:
				if ns.Buckets != 0 {
					return errors.New("a draining or dead node has buckets")
				}
			}
		}
		if sum != usermap.Buckets {
			return errors.New("buckets do not sum to the total")
		}
		return nil
	}
	all := map[string]membership.State{a.ID(): membership.Alive, b.ID(): membership.Alive, c.ID(): membership.Alive}
	for _, n := range []*Node{a, b, c} {
		eventually(t, "three alive nodes", func() error { return check(n, all) })
	}

	state, err := a.Drain(ctx, c.ID(), true)
	if err != nil || state != membership.Draining {
		t.Fatalf("Drain(c) through a = %q, %v", state, err)
	}
	all[c.ID()] = membership.Draining
	eventually(t, "c draining, seen by b", func() error { return check(b, all) })
	if _, err := a.Drain(ctx, c.ID(), false); err != nil {
		t.Fatal(err)
	}
	all[c.ID()] = membership.Alive
	eventually(t, "c back in service", func() error { return check(a, all) })
	if _, err := a.Drain(ctx, credentials.NewNodeID(), true); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("Drain of an unknown node = %v, want ErrUnknownNode", err)
	}

	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	all[c.ID()] = membership.Dead
	eventually(t, "c dead, its buckets on a and b", func() error { return check(a, all) })
}
