package membership

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/hashicorp/memberlist"
)

// ErrBadMeta: a node's metadata (from the network) does not decode.
var ErrBadMeta = errors.New("membership: bad node metadata")

// Meta is what a node tells the others of itself, in its memberlist
// metadata (at most memberlist.MetaMaxSize bytes, sent with every alive
// message, so it changes rarely: a change costs a gossip round).
type Meta struct {
	// Addr is the node's RPC address (host:port): today the cluster
	// listener's advertised address, which also carries gossip.
	Addr string
	// Weight is the node's share of buckets in the user map, relative to
	// the others' (usermap.Member.Weight); 0 gives it none.
	Weight uint32
	// Draining: the node gives its buckets up (quill cluster drain).
	Draining bool
}

// wireMeta is Meta's encoding: JSON, so that a field added later is
// ignored by older nodes.
type wireMeta struct {
	V        int    `json:"v"`
	Addr     string `json:"addr"`
	Weight   uint32 `json:"w"`
	Draining bool   `json:"d,omitempty"`
}

func encodeMeta(m Meta) ([]byte, error) {
	b, err := json.Marshal(wireMeta{V: 1, Addr: m.Addr, Weight: m.Weight, Draining: m.Draining})
	if err != nil {
		return nil, err
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("membership: metadata of %d bytes exceeds %d", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

// decodeMeta parses another node's metadata: version 1 with an address
// of the form IP:port. Anything else fails with ErrBadMeta.
func decodeMeta(b []byte) (Meta, error) {
	if len(b) > memberlist.MetaMaxSize {
		return Meta{}, fmt.Errorf("%w: %d bytes", ErrBadMeta, len(b))
	}
	var w wireMeta
	if err := json.Unmarshal(b, &w); err != nil {
		return Meta{}, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	if w.V != 1 {
		return Meta{}, fmt.Errorf("%w: version %d", ErrBadMeta, w.V)
	}
	ap, err := netip.ParseAddrPort(w.Addr)
	if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() {
		return Meta{}, fmt.Errorf("%w: address %q", ErrBadMeta, w.Addr)
	}
	return Meta{Addr: ap.String(), Weight: w.Weight, Draining: w.Draining}, nil
}
