package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"quill/internal/cluster/credentials"
	"quill/internal/store"
)

// hubRecorder is a node's Local: the IDs it was told of, in order.
type hubRecorder chan store.ID

func (h hubRecorder) Notify(id store.ID) {
	select {
	case h <- id:
	default:
		panic("hubRecorder full")
	}
}

func startNodeWith(t *testing.T, st credentials.Secrets, local hubRecorder, join ...string) *Node {
	t.Helper()
	n, err := Start(context.Background(), Options{
		DataDir: t.TempDir(), Addr: "127.0.0.1:0", Join: join, Secrets: st, Ownership: st.(store.Ownership),
		Local: local,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(context.Background()) })
	return n
}

// await returns when h has been told of id, failing after 10 s; other IDs
// told before it are skipped.
func (h hubRecorder) await(t *testing.T, id store.ID) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-h:
			if got == id {
				return
			}
		case <-deadline:
			t.Fatalf("event for %s never arrived", id)
		}
	}
}

// watchAll makes every node's fan-out watch ids, as its hub would when
// sessions select them.
func watchAll(ids []store.ID, nodes ...*Node) {
	for _, n := range nodes {
		for _, id := range ids {
			n.Events().Watch(id)
		}
	}
}

// An event published on one node reaches its own hub and the hub of every
// other live node that watches the mailbox, over the cluster's mTLS
// channel; once a node is gone the others keep receiving. The latency from
// Notify to a peer's hub is logged (the bound: a delivery through
// node A seen by an IDLE session on node B within 100 ms at the median,
// end to end, is measured by e2e TestCassandraIdleAcrossNodes).
func TestEventsReachEveryWatchingNode(t *testing.T) {
	st := openStore(t)
	if _, _, err := credentials.Init(context.Background(), st, time.Now()); err != nil {
		t.Fatal(err)
	}
	ha, hb, hc := make(hubRecorder, 4096), make(hubRecorder, 4096), make(hubRecorder, 4096)
	a := startNodeWith(t, st, ha)
	b := startNodeWith(t, st, hb, a.Addr())
	c := startNodeWith(t, st, hc, a.Addr())
	pool := make([]store.ID, 60)
	for i := range pool {
		pool[i] = store.NewID()
	}
	watchAll(pool, a, b, c)
	// Until a node's fan-out knows its peers and their watch sets, its
	// events reach only its own hub: publish until each peer has heard
	// one (any one: an event may arrive after the next is published).
	reach := func(from *Node, own hubRecorder, peers ...hubRecorder) {
		t.Helper()
		for _, h := range peers {
			i := 0
			eventually(t, "events reach a peer", func() error {
				id := pool[50+i%10] // the last ten: warm-up only
				i++
				from.Events().Notify(id)
				for {
					select {
					case <-h:
						return nil
					case <-time.After(100 * time.Millisecond):
						return fmt.Errorf("no event")
					}
				}
			})
		}
		// Drain what the warm-up left in the hubs.
		for _, h := range append([]hubRecorder{own}, peers...) {
			for len(h) > 0 {
				<-h
			}
		}
	}
	reach(a, ha, hb, hc)
	var lat []time.Duration
	for i := range 50 {
		id := pool[i]
		start := time.Now()
		a.Events().Notify(id)
		ha.await(t, id)
		hb.await(t, id)
		lat = append(lat, time.Since(start))
		hc.await(t, id)
	}
	slices.Sort(lat)
	t.Logf("Notify on a to b's hub: median %v, max %v (50 events)", lat[len(lat)/2], lat[len(lat)-1])

	// From b too, to a and c.
	reach(b, hb, ha, hc)
	b.Events().Notify(pool[0])
	ha.await(t, pool[0])
	hc.await(t, pool[0])

	// A mailbox b does not watch costs b nothing: an event for it reaches
	// c (which watches it), not b. A later event b does watch goes the
	// same way after it, so b has heard all it ever will of the first.
	only := store.NewID()
	c.Events().Watch(only)
	eventually(t, "c's watch reaches a", func() error {
		a.Events().Notify(only)
		select {
		case got := <-hc:
			if got == only {
				return nil
			}
			return fmt.Errorf("c heard %s", got)
		case <-time.After(100 * time.Millisecond):
			return fmt.Errorf("no event")
		}
	})
	a.Events().Notify(pool[1])
	hb.await(t, pool[1]) // fails if b heard only
	for len(hb) > 0 {
		if got := <-hb; got == only {
			t.Fatal("b was told of a mailbox it does not watch")
		}
	}
	// Once b stops watching, events stop going to it.
	b.Events().Unwatch(pool[2])
	eventually(t, "b's unwatch reaches a", func() error {
		a.Events().Notify(pool[2])
		a.Events().Notify(pool[3])
		heard := false
		for {
			got := <-hb
			heard = heard || got == pool[2]
			if got == pool[3] {
				break
			}
		}
		if heard {
			return fmt.Errorf("b still told of %s", pool[2])
		}
		return nil
	})

	if err := c.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c gone from a's view", func() error {
		for _, m := range a.Membership().Live().Members {
			if m.ID == c.ID() {
				return fmt.Errorf("c still live")
			}
		}
		return nil
	})
	a.Events().Notify(pool[4])
	hb.await(t, pool[4])
}
