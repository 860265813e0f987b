package credentials

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
)

// NodeIDBytes is the size of a node ID's random part; its text form is
// twice as many lower-case hex digits.
const NodeIDBytes = 16

// DefaultLeafLifetime is how long a node's leaf certificate is valid. The
// node issues itself a new one halfway through, so a leaf in use is never
// older than half of it; a stolen leaf (without the CA key) is of use for
// a day at most.
const DefaultLeafLifetime = 24 * time.Hour

// uriPrefix precedes a node ID in its leaf's URI SAN.
const uriPrefix = "urn:quill:node:"

// ErrPeer: a peer's certificate does not chain to the cluster CA, names
// no node, or names another node than the one dialled.
var ErrPeer = errors.New("credentials: peer refused")

// NewNodeID returns a fresh random node ID.
func NewNodeID() string {
	b := make([]byte, NodeIDBytes)
	if _, err := rand.Read(b); err != nil {
		panic("credentials: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// ValidNodeID reports whether s is a node ID as NewNodeID makes them.
func ValidNodeID(s string) bool {
	if len(s) != 2*NodeIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Node is one node's view of the credentials: its ID, its current leaf
// certificate (reissued from the CA halfway through its lifetime), and
// the TLS configurations that authenticate peers. It is safe for
// concurrent use.
type Node struct {
	id       string
	rec      *Record
	roots    *x509.CertPool
	lifetime time.Duration
	now      func() time.Time

	mu struct {
		sync.Mutex
		leaf    *tls.Certificate
		renewAt time.Time
	}
}

// NodeOptions tune ForNode; the zero value is the default.
type NodeOptions struct {
	LeafLifetime time.Duration    // default DefaultLeafLifetime
	Now          func() time.Time // default time.Now
}

// ForNode returns node id's credentials and issues its first leaf.
func (r *Record) ForNode(id string, opts NodeOptions) (*Node, error) {
	if !ValidNodeID(id) {
		return nil, fmt.Errorf("credentials: %q is not a node ID", id)
	}
	if opts.LeafLifetime <= 0 {
		opts.LeafLifetime = DefaultLeafLifetime
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	n := &Node{id: id, rec: r, roots: x509.NewCertPool(), lifetime: opts.LeafLifetime, now: opts.Now}
	n.roots.AddCert(r.CA)
	if _, err := n.certificate(); err != nil {
		return nil, err
	}
	return n, nil
}

// ID returns the node's ID.
func (n *Node) ID() string { return n.id }

// GossipKey returns the cluster's gossip key.
func (n *Node) GossipKey() []byte { return n.rec.GossipKey }

// Fingerprint returns the CA's fingerprint (Record.Fingerprint).
func (n *Node) Fingerprint() string { return n.rec.Fingerprint() }

// certificate returns the current leaf, issuing a new one once the
// current one is past half its lifetime.
func (n *Node) certificate() (*tls.Certificate, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	if n.mu.leaf != nil && now.Before(n.mu.renewAt) {
		return n.mu.leaf, nil
	}
	leaf, err := n.rec.issue(n.id, now, n.lifetime)
	if err != nil {
		if n.mu.leaf != nil && now.Before(n.mu.leaf.Leaf.NotAfter) {
			return n.mu.leaf, nil // keep the valid one; try again next time
		}
		return nil, err
	}
	n.mu.leaf, n.mu.renewAt = leaf, now.Add(n.lifetime/2)
	return leaf, nil
}

// issue makes a leaf certificate for node id, valid for both ends of a
// connection.
func (r *Record) issue(id string, now time.Time, lifetime time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("credentials: leaf key: %w", err)
	}
	u, err := url.Parse(uriPrefix + id)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{Organization: []string{"Quill"}, CommonName: "quill node " + id},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, r.CA, &key.PublicKey, r.CAKey)
	if err != nil {
		return nil, fmt.Errorf("credentials: leaf certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// ServerTLS returns the configuration of the node's listener: TLS 1.3
// only, the node's leaf, a client certificate required that chains to the
// cluster CA and names a node; protos are the ALPN protocols offered, and a
// client that offers none of them is refused.
func (n *Node) ServerTLS(protos []string) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		NextProtos:     protos,
		ClientAuth:     tls.RequireAnyClientCert, // verified by VerifyConnection
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return n.certificate() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := n.verify(cs, x509.ExtKeyUsageClientAuth, "")
			return err
		},
	}
}

// ClientTLS returns the configuration to dial a peer: TLS 1.3 only, the
// node's leaf as client certificate, the server's leaf verified against the
// cluster CA and, unless peer is "", required to name node peer. (The
// server's host name is not checked: node IDs, not names, identify nodes.)
func (n *Node) ClientTLS(peer string, protos []string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		NextProtos:           protos,
		InsecureSkipVerify:   true, // verified by VerifyConnection, against the cluster CA
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return n.certificate() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := n.verify(cs, x509.ExtKeyUsageServerAuth, peer)
			return err
		},
	}
}

// verify checks a peer's certificate chain against the cluster CA for
// usage, and returns the node ID it names, which must be want unless want
// is "".
func (n *Node) verify(cs tls.ConnectionState, usage x509.ExtKeyUsage, want string) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", fmt.Errorf("%w: no certificate", ErrPeer)
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: n.roots, Intermediates: inter, CurrentTime: n.now(), KeyUsages: []x509.ExtKeyUsage{usage},
	}); err != nil {
		return "", fmt.Errorf("%w: %w", ErrPeer, err)
	}
	id, err := PeerID(leaf)
	if err != nil {
		return "", err
	}
	if want != "" && id != want {
		return "", fmt.Errorf("%w: certificate of node %s, dialled node %s", ErrPeer, id, want)
	}
	return id, nil
}

// PeerID returns the node ID a leaf certificate names (its one URI SAN).
// It does not verify the certificate: use it on verified chains only.
func PeerID(leaf *x509.Certificate) (string, error) {
	if len(leaf.URIs) != 1 {
		return "", fmt.Errorf("%w: %d URI SANs, want 1", ErrPeer, len(leaf.URIs))
	}
	id, ok := strings.CutPrefix(leaf.URIs[0].String(), uriPrefix)
	if !ok || !ValidNodeID(id) {
		return "", fmt.Errorf("%w: URI SAN %q names no node", ErrPeer, leaf.URIs[0])
	}
	return id, nil
}
