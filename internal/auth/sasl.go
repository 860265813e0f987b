package auth

import (
	"bytes"
	"errors"
	"unicode/utf8"
)

// ErrMalformed is returned for a SASL message that does not parse.
var ErrMalformed = errors.New("auth: malformed SASL message")

// ParsePlain decodes the (already base64-decoded) message of the SASL PLAIN
// mechanism, RFC 4616 section 2: [authzid] NUL authcid NUL passwd.
// Quill supports no proxy authorization, so callers must refuse a non-empty
// authzid that differs from authcid.
func ParsePlain(msg []byte) (authzid, authcid, passwd string, err error) {
	parts := bytes.Split(msg, []byte{0})
	if len(parts) != 3 || len(parts[1]) == 0 || len(parts[1]) > 255 || len(parts[2]) > 255 {
		return "", "", "", ErrMalformed
	}
	for _, p := range parts {
		if !utf8.Valid(p) {
			return "", "", "", ErrMalformed
		}
	}
	return string(parts[0]), string(parts[1]), string(parts[2]), nil
}
