package auth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
)

// KDFParams are argon2id parameters (RFC 9106). The defaults follow the
// OWASP recommendation for argon2id (19 MiB, 2 passes, 1 lane): strong
// against offline guessing while keeping a login to a few milliseconds of
// one core, which matters when POP3 clients log in every few minutes.
type KDFParams struct {
	MemoryKiB uint32
	Time      uint32
	Threads   uint8
}

// DefaultKDF is used for new password hashes.
var DefaultKDF = KDFParams{MemoryKiB: 19 * 1024, Time: 2, Threads: 1}

const saltLen, keyLen = 16, 32

var errBadHash = errors.New("auth: unrecognized password hash")

// HashPassword returns the PHC string form of an argon2id hash of password:
// $argon2id$v=19$m=...,t=...,p=...$salt$hash.
func HashPassword(password string, p KDFParams) (string, error) {
	salt := make([]byte, saltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key := argon2.IDKey([]byte(password), salt, p.Time, p.MemoryKiB, p.Threads, keyLen)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, p.MemoryKiB, p.Time, p.Threads, b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

// VerifyPassword reports whether password matches a PHC argon2id hash, in
// time independent of where the two differ.
func VerifyPassword(hash, password string) (bool, error) {
	h, err := parseHash(hash)
	if err != nil {
		return false, err
	}
	return h.verify(password), nil
}

// phcHash is a parsed PHC argon2id hash.
type phcHash struct {
	p          KDFParams
	salt, want []byte
}

// parseHash parses $argon2id$v=19$m=...,t=...,p=...$salt$hash, with bounds
// on the parameters so that a corrupt hash cannot make verification
// unbounded.
func parseHash(hash string) (phcHash, error) {
	parts := strings.Split(hash, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return phcHash{}, errBadHash
	}
	var version int
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return phcHash{}, errBadHash
	}
	var p KDFParams
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &p.MemoryKiB, &p.Time, &p.Threads); err != nil {
		return phcHash{}, errBadHash
	}
	if p.MemoryKiB == 0 || p.MemoryKiB > 4<<20 || p.Time == 0 || p.Time > 64 || p.Threads == 0 {
		return phcHash{}, errBadHash
	}
	b64 := base64.RawStdEncoding
	salt, err := b64.DecodeString(parts[4])
	if err != nil {
		return phcHash{}, errBadHash
	}
	want, err := b64.DecodeString(parts[5])
	if err != nil || len(want) == 0 || len(want) > 128 {
		return phcHash{}, errBadHash
	}
	return phcHash{p: p, salt: salt, want: want}, nil
}

func (h phcHash) verify(password string) bool {
	got := argon2.IDKey([]byte(password), h.salt, h.p.Time, h.p.MemoryKiB, h.p.Threads, uint32(len(h.want)))
	return subtle.ConstantTimeCompare(got, h.want) == 1
}
