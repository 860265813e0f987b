//go:build !unix

package textconn

import "errors"

var errTooManyFiles = errors.New("textconn: never matches")
