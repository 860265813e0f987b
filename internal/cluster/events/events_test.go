package events

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"quill/internal/cluster/clusterpb"
	"quill/internal/store"
)

type ids []store.ID

func (l *ids) Notify(id store.ID) { *l = append(*l, id) }

// The service hands every well-formed ID to the local hub and ignores
// the rest: a peer's bytes are not trusted to be IDs.
func TestServiceIgnoresMalformedIDs(t *testing.T) {
	var got ids
	f := New(Options{Local: &got})
	a, b := store.NewID(), store.NewID()
	_, err := f.Service().Changed(context.Background(), &clusterpb.ChangedRequest{
		Mailboxes: [][]byte{a[:], {1, 2, 3}, nil, append(b[:], 0), b[:]},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("local hub told %v, want [%s %s]", got, a, b)
	}
}

// Events for a peer that does not keep up wait in a bounded set: one call
// in flight, at most MaxPending IDs behind it, the rest dropped and
// counted. The local hub hears every one; the peer only those it watches.
func TestPendingBounded(t *testing.T) {
	var local ids
	release := make(chan struct{})
	dialed := make(chan struct{}, 1)
	f := New(Options{Local: &local, MaxPending: 4, Dial: func(peer, addr string) (*grpc.ClientConn, error) {
		select {
		case dialed <- struct{}{}:
		default:
		}
		<-release
		return nil, errors.New("peer unreachable")
	}})
	watched := make([][]byte, 10)
	for i := range watched {
		id := store.NewID()
		watched[i] = id[:]
	}
	if _, err := f.Service().Changed(context.Background(), &clusterpb.ChangedRequest{Node: "p", Full: true, Watch: watched}); err != nil {
		t.Fatal(err)
	}
	f.SetPeers([]Peer{{ID: "p", Addr: "127.0.0.1:1"}})
	<-dialed // the first call (this node's watch set) is in flight
	for _, b := range watched {
		f.Notify(store.ID(b))
	}
	f.Notify(store.NewID()) // not watched by p: not queued for it
	if d := testutil.ToFloat64(f.m.dropped); d != 6 {
		t.Fatalf("%v dropped while the call hung, want 6 (10 behind it, 4 kept)", d)
	}
	close(release)
	f.Close()
	if len(local) != 11 {
		t.Fatalf("local hub told %d events, want 11", len(local))
	}
}

// A peer's watch set: changes to a set this node does not keep ask for
// the whole set (Resync), a whole set replaces what was kept, changes
// apply to it, and a peer no longer listed loses it.
func TestPeerWatchSets(t *testing.T) {
	var local ids
	f := New(Options{Node: "self", Local: &local})
	changed := func(req *clusterpb.ChangedRequest) *clusterpb.ChangedReply {
		t.Helper()
		rep, err := f.Service().Changed(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	x, y := store.NewID(), store.NewID()
	if !changed(&clusterpb.ChangedRequest{Node: "p", Watch: [][]byte{x[:]}}).Resync {
		t.Fatal("changes to an unknown set applied")
	}
	if len(f.interest) != 0 {
		t.Fatalf("kept %v", f.interest)
	}
	if changed(&clusterpb.ChangedRequest{Node: "p", Full: true, Watch: [][]byte{x[:], {1}}}).Resync {
		t.Fatal("whole set refused")
	}
	changed(&clusterpb.ChangedRequest{Node: "p", Watch: [][]byte{y[:]}, Unwatch: [][]byte{x[:]}})
	if _, ok := f.interest["p"][y]; !ok || len(f.interest["p"]) != 1 {
		t.Fatalf("p watches %v, want only %s", f.interest["p"], y)
	}
	// A node's own ID and calls without one change no set.
	changed(&clusterpb.ChangedRequest{Node: "self", Full: true})
	changed(&clusterpb.ChangedRequest{Full: true})
	if len(f.interest) != 1 {
		t.Fatalf("kept %v", f.interest)
	}
	f.SetPeers(nil)
	if len(f.interest) != 0 {
		t.Fatalf("kept %v after p left", f.interest)
	}
	f.Close()
}
