//go:build unix

package textconn

import "syscall"

// errTooManyFiles is the transient accept failure when descriptors run out.
var errTooManyFiles error = syscall.EMFILE
