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
// counted. The local hub hears every one.
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
	f.SetPeers([]Peer{{ID: "p", Addr: "127.0.0.1:1"}})
	f.Notify(store.NewID())
	<-dialed // the first call is in flight, holding one ID
	for range 10 {
		f.Notify(store.NewID())
	}
	if d := testutil.ToFloat64(f.m.dropped); d != 6 {
		t.Fatalf("%v dropped while the call hung, want 6 (10 behind it, 4 kept)", d)
	}
	close(release)
	f.Close()
	if len(local) != 11 {
		t.Fatalf("local hub told %d events, want 11", len(local))
	}
}
