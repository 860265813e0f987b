// Package credentials holds the cluster's credentials and what a node makes
// of them. The credentials are one record in the store (store.Secrets,
// under SecretName), created once by `quill cluster init` and read by every
// node at start, so that nodes sharing a store share the credentials
// without copying files:
//
//   - a cluster CA (ECDSA P-256 certificate and key) that every node uses
//     to issue itself a short-lived leaf certificate naming its node ID in
//     a URI SAN (urn:quill:node:ID); peers accept a TLS 1.3 connection only
//     from a leaf that chains to the CA, and, when they dialled a given
//     node, only from that node's leaf (Node.ServerTLS, Node.ClientTLS);
//   - a random 32-byte gossip key: memberlist's keyring key (AES-256-GCM)
//     for the UDP packets of membership.
//
// Anyone who can read the store can read the CA key and join the cluster:
// the store is the cluster's root of trust (docs/adr/0021).
package credentials

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"time"

	"quill/internal/store"
)

// SecretName is the store.Secrets name of the credentials record. A new
// record format takes a new name, so that binaries of both formats can
// tell theirs apart.
const SecretName = "cluster/credentials/v1"

// GossipKeyBytes is the size of the gossip key (AES-256).
const GossipKeyBytes = 32

// caLifetime is the CA's validity: the cluster's whole life, since nothing
// rotates the CA yet.
const caLifetime = 30 * 365 * 24 * time.Hour

// clockSkew backdates every certificate's NotBefore, so that a node whose
// clock is a little behind the issuer's accepts it at once.
const clockSkew = 5 * time.Minute

// ErrNotInitialized: the store holds no credentials; `quill cluster init`
// creates them. It wraps store.ErrNotFound.
var ErrNotInitialized = fmt.Errorf("cluster credentials are not in the store: run `quill cluster init --config FILE` once: %w", store.ErrNotFound)

// ErrMalformed: the stored record does not parse or is inconsistent.
var ErrMalformed = errors.New("credentials: malformed record")

// Secrets is what the package needs of the store.
type Secrets interface {
	CreateSecret(ctx context.Context, name string, value []byte) error
	GetSecret(ctx context.Context, name string) ([]byte, error)
}

var _ Secrets = store.Secrets(nil)

// Record is the cluster's credentials.
type Record struct {
	CA        *x509.Certificate
	CAKey     *ecdsa.PrivateKey
	GossipKey []byte // GossipKeyBytes
	Created   time.Time
}

// Generate makes new credentials: a fresh CA and gossip key.
func Generate(now time.Time) (*Record, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("credentials: CA key: %w", err)
	}
	ski := sha256.Sum256(elliptic.MarshalCompressed(key.Curve, key.X, key.Y))
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{Organization: []string{"Quill"}, CommonName: "Quill cluster CA"},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		SubjectKeyId:          ski[:20],
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("credentials: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("credentials: CA certificate: %w", err)
	}
	gossip := make([]byte, GossipKeyBytes)
	if _, err := rand.Read(gossip); err != nil {
		return nil, fmt.Errorf("credentials: gossip key: %w", err)
	}
	return &Record{CA: ca, CAKey: key, GossipKey: gossip, Created: now.UTC().Truncate(time.Second)}, nil
}

func randomSerial() *big.Int {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("credentials: crypto/rand failed: " + err.Error())
	}
	b[0] &= 0x7f // positive
	return new(big.Int).SetBytes(b)
}

// encoded is the stored form of a Record (JSON; []byte fields in base64).
type encoded struct {
	Version   int       `json:"version"`
	CA        []byte    `json:"ca"`         // DER certificate
	CAKey     []byte    `json:"ca_key"`     // PKCS #8 DER
	GossipKey []byte    `json:"gossip_key"` // GossipKeyBytes
	Created   time.Time `json:"created"`
}

// Marshal returns the stored form of r.
func (r *Record) Marshal() ([]byte, error) {
	key, err := x509.MarshalPKCS8PrivateKey(r.CAKey)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	return json.Marshal(encoded{Version: 1, CA: r.CA.Raw, CAKey: key, GossipKey: r.GossipKey, Created: r.Created})
}

// Parse reads a record made by Marshal and checks it: version 1, a CA
// certificate whose key is the ECDSA P-256 key given, a gossip key of
// GossipKeyBytes. Any other input fails with ErrMalformed.
func Parse(b []byte) (*Record, error) {
	var e encoded
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if e.Version != 1 {
		return nil, fmt.Errorf("%w: version %d", ErrMalformed, e.Version)
	}
	ca, err := x509.ParseCertificate(e.CA)
	if err != nil {
		return nil, fmt.Errorf("%w: CA certificate: %v", ErrMalformed, err)
	}
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%w: the CA certificate may not sign certificates", ErrMalformed)
	}
	k, err := x509.ParsePKCS8PrivateKey(e.CAKey)
	if err != nil {
		return nil, fmt.Errorf("%w: CA key: %v", ErrMalformed, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: CA key is not ECDSA P-256", ErrMalformed)
	}
	if pub, ok := ca.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("%w: CA key does not match its certificate", ErrMalformed)
	}
	if len(e.GossipKey) != GossipKeyBytes {
		return nil, fmt.Errorf("%w: gossip key of %d bytes, want %d", ErrMalformed, len(e.GossipKey), GossipKeyBytes)
	}
	return &Record{CA: ca, CAKey: key, GossipKey: e.GossipKey, Created: e.Created}, nil
}

// Fingerprint identifies the CA: "sha256:" and the hex SHA-256 of its DER.
func (r *Record) Fingerprint() string {
	sum := sha256.Sum256(r.CA.Raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Init creates the cluster's credentials in s unless they exist. It
// returns the record the store holds afterwards and whether this call
// created it; of concurrent calls, in any processes, exactly one creates
// (store.Secrets.CreateSecret).
func Init(ctx context.Context, s Secrets, now time.Time) (rec *Record, created bool, err error) {
	rec, err = Generate(now)
	if err != nil {
		return nil, false, err
	}
	b, err := rec.Marshal()
	if err != nil {
		return nil, false, err
	}
	switch err := s.CreateSecret(ctx, SecretName, b); {
	case err == nil:
		return rec, true, nil
	case errors.Is(err, store.ErrExists):
		rec, err := Load(ctx, s)
		return rec, false, err
	default:
		return nil, false, fmt.Errorf("credentials: storing: %w", err)
	}
}

// Load reads the credentials from s: ErrNotInitialized when there are
// none, ErrMalformed when the record is bad.
func Load(ctx context.Context, s Secrets) (*Record, error) {
	b, err := s.GetSecret(ctx, SecretName)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNotInitialized
	}
	if err != nil {
		return nil, fmt.Errorf("credentials: reading: %w", err)
	}
	return Parse(b)
}
