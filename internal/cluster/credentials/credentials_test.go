package credentials

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

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

func TestRecordRoundTrip(t *testing.T) {
	rec, err := Generate(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := rec.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse(Marshal) = %v", err)
	}
	if got.Fingerprint() != rec.Fingerprint() || !bytes.Equal(got.GossipKey, rec.GossipKey) ||
		!got.CAKey.Equal(rec.CAKey) || !got.Created.Equal(rec.Created) {
		t.Fatalf("round trip changed the record")
	}
	other, _ := Generate(time.Now())
	if other.Fingerprint() == rec.Fingerprint() || bytes.Equal(other.GossipKey, rec.GossipKey) {
		t.Fatal("two Generate calls made the same CA or gossip key")
	}
}

// TestParseRefusesInconsistentRecords: each field checked by Parse fails
// the record on its own.
func TestParseRefusesInconsistentRecords(t *testing.T) {
	a, _ := Generate(time.Now())
	b, _ := Generate(time.Now())
	good, _ := a.Marshal()
	var e encoded
	if err := json.Unmarshal(good, &e); err != nil {
		t.Fatal(err)
	}
	keyB, _ := b.Marshal()
	var eb encoded
	json.Unmarshal(keyB, &eb)
	leaf, err := a.issue(NewNodeID(), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*encoded){
		"version 2":             func(e *encoded) { e.Version = 2 },
		"key of another CA":     func(e *encoded) { e.CAKey = eb.CAKey },
		"short gossip key":      func(e *encoded) { e.GossipKey = e.GossipKey[:16] },
		"leaf instead of a CA":  func(e *encoded) { e.CA = leaf.Certificate[0] },
		"certificate truncated": func(e *encoded) { e.CA = e.CA[:len(e.CA)/2] },
		"no key":                func(e *encoded) { e.CAKey = nil },
	} {
		c := e
		mutate(&c)
		b, _ := json.Marshal(c)
		if _, err := Parse(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Parse = %v, want ErrMalformed", name, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	rec, err := Generate(time.Now())
	if err != nil {
		f.Fatal(err)
	}
	good, _ := rec.Marshal()
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"ca":"AAAA","ca_key":"AAAA","gossip_key":"AAAA"}`))
	f.Add([]byte(`null`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse error %v is not ErrMalformed", err)
			}
			return
		}
		// Whatever parses is consistent: it marshals and parses again to
		// the same CA, and issues leaves that verify against itself.
		again, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		r2, err := Parse(again)
		if err != nil || r2.Fingerprint() != r.Fingerprint() {
			t.Fatalf("re-parse: %v", err)
		}
	})
}

// TestInitOnce: the first Init creates, the next ones find the same
// credentials, and of concurrent Inits exactly one creates.
func TestInitOnce(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	if _, err := Load(ctx, st); !errors.Is(err, ErrNotInitialized) || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Load before Init = %v, want ErrNotInitialized", err)
	}
	rec, created, err := Init(ctx, st, time.Now())
	if err != nil || !created {
		t.Fatalf("first Init = %v, created %v", err, created)
	}
	again, created, err := Init(ctx, st, time.Now())
	if err != nil || created || again.Fingerprint() != rec.Fingerprint() {
		t.Fatalf("second Init = %v, created %v; want the first credentials unchanged", err, created)
	}
	loaded, err := Load(ctx, st)
	if err != nil || loaded.Fingerprint() != rec.Fingerprint() || !bytes.Equal(loaded.GossipKey, rec.GossipKey) {
		t.Fatalf("Load = %v; want the first credentials", err)
	}

	fresh := openStore(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	fingerprints := map[string]int{}
	createdBy := 0
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, c, err := Init(ctx, fresh, time.Now())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			fingerprints[r.Fingerprint()]++
			if c {
				createdBy++
			}
		}()
	}
	wg.Wait()
	if createdBy != 1 || len(fingerprints) != 1 {
		t.Fatalf("concurrent Init: %d created, %d distinct CAs returned; want 1 and 1", createdBy, len(fingerprints))
	}
}

func TestNodeID(t *testing.T) {
	id := NewNodeID()
	if !ValidNodeID(id) || id == NewNodeID() {
		t.Fatalf("NewNodeID = %q", id)
	}
	for _, bad := range []string{"", "x", id[:31], id + "0", "0123456789ABCDEF0123456789abcdef", "g123456789abcdef0123456789abcdef"} {
		if ValidNodeID(bad) {
			t.Errorf("ValidNodeID(%q) = true", bad)
		}
	}
	rec, _ := Generate(time.Now())
	if _, err := rec.ForNode("not-an-id", NodeOptions{}); err == nil {
		t.Fatal("ForNode accepted a malformed ID")
	}
}

// handshake runs one TLS handshake over real loopback TCP between a server
// and a client configuration and returns both sides' errors, after one
// byte has been echoed (in TLS 1.3 a client learns that the server refused
// its certificate only on its first read).
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error, peer string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, server)
		if err := tc.Handshake(); err != nil {
			done <- err
			return
		}
		var b [1]byte
		if _, err := io.ReadFull(tc, b[:]); err != nil {
			done <- err
			return
		}
		_, err = tc.Write(b[:])
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, client)
	clientErr = tc.Handshake()
	if clientErr == nil {
		if _, clientErr = tc.Write([]byte{'x'}); clientErr == nil {
			var b [1]byte
			_, clientErr = io.ReadFull(tc, b[:])
		}
		if clientErr == nil && len(tc.ConnectionState().PeerCertificates) > 0 {
			peer, _ = PeerID(tc.ConnectionState().PeerCertificates[0])
		}
	}
	c.Close()
	return <-done, clientErr, peer
}

func TestMutualTLS(t *testing.T) {
	rec, _ := Generate(time.Now())
	foreign, _ := Generate(time.Now())
	a, err := rec.ForNode(NewNodeID(), NodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := rec.ForNode(NewNodeID(), NodeOptions{})
	stranger, _ := foreign.ForNode(NewNodeID(), NodeOptions{})
	protos := []string{"test/1"}

	t.Run("same cluster", func(t *testing.T) {
		se, ce, peer := handshake(t, a.ServerTLS(protos), b.ClientTLS(a.ID(), protos))
		if se != nil || ce != nil || peer != a.ID() {
			t.Fatalf("server %v, client %v, peer %q; want success with node %s", se, ce, peer, a.ID())
		}
	})
	t.Run("any node of the cluster", func(t *testing.T) {
		if se, ce, _ := handshake(t, a.ServerTLS(protos), b.ClientTLS("", protos)); se != nil || ce != nil {
			t.Fatalf("server %v, client %v", se, ce)
		}
	})
	t.Run("another node than dialled", func(t *testing.T) {
		_, ce, _ := handshake(t, a.ServerTLS(protos), b.ClientTLS(NewNodeID(), protos))
		if !errors.Is(ce, ErrPeer) {
			t.Fatalf("client %v, want ErrPeer", ce)
		}
	})
	t.Run("server of another CA", func(t *testing.T) {
		_, ce, _ := handshake(t, stranger.ServerTLS(protos), b.ClientTLS("", protos))
		if !errors.Is(ce, ErrPeer) {
			t.Fatalf("client %v, want ErrPeer", ce)
		}
	})
	t.Run("client of another CA", func(t *testing.T) {
		cfg := stranger.ClientTLS("", protos)
		cfg.VerifyConnection = nil // the stranger would accept the server: the server must refuse it
		se, ce, _ := handshake(t, a.ServerTLS(protos), cfg)
		if !errors.Is(se, ErrPeer) || ce == nil {
			t.Fatalf("server %v, client %v; want the server to refuse", se, ce)
		}
	})
	t.Run("client without certificate", func(t *testing.T) {
		cfg := b.ClientTLS("", protos)
		cfg.GetClientCertificate = nil
		se, ce, _ := handshake(t, a.ServerTLS(protos), cfg)
		if se == nil || ce == nil {
			t.Fatalf("server %v, client %v; want both to fail", se, ce)
		}
	})
	t.Run("TLS 1.2 client", func(t *testing.T) {
		cfg := b.ClientTLS("", protos)
		cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
		if se, ce, _ := handshake(t, a.ServerTLS(protos), cfg); se == nil || ce == nil {
			t.Fatalf("server %v, client %v; want both to fail", se, ce)
		}
	})
	t.Run("no common protocol", func(t *testing.T) {
		if se, ce, _ := handshake(t, a.ServerTLS(protos), b.ClientTLS("", []string{"other/1"})); se == nil || ce == nil {
			t.Fatalf("server %v, client %v; want both to fail", se, ce)
		}
	})
}

// TestLeafRenewal: a node reissues its leaf halfway through its lifetime,
// and a peer refuses an expired leaf.
func TestLeafRenewal(t *testing.T) {
	rec, _ := Generate(time.Now())
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	n, err := rec.ForNode(NewNodeID(), NodeOptions{LeafLifetime: time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := n.certificate()
	advance(20 * time.Minute)
	if c, _ := n.certificate(); c != first {
		t.Fatal("leaf reissued before half its lifetime")
	}
	advance(11 * time.Minute)
	second, _ := n.certificate()
	if second == first || !second.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Fatal("leaf not reissued past half its lifetime")
	}
	// A verifier whose clock is past the first leaf's end refuses it.
	late, _ := rec.ForNode(NewNodeID(), NodeOptions{Now: func() time.Time { return first.Leaf.NotAfter.Add(time.Minute) }})
	if _, err := late.verify(tls.ConnectionState{PeerCertificates: []*x509.Certificate{first.Leaf}}, x509.ExtKeyUsageServerAuth, ""); !errors.Is(err, ErrPeer) {
		t.Fatalf("expired leaf: %v, want ErrPeer", err)
	}
}
