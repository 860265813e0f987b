package store

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// NormalizeFlags sorts and deduplicates flags and rejects what a store
// cannot hold: \Recent (session state, RFC 3501 section 2.3.2), empty or
// over-long names, and anything that is not an IMAP flag atom. Every engine
// applies it, so all of them accept exactly the same flags.
func NormalizeFlags(flags []string) ([]string, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(flags))
	for _, f := range flags {
		if f == "" || len(f) > 255 || strings.EqualFold(f, `\Recent`) || strings.ContainsAny(f, " (){%*\"]\x00\r\n") {
			return nil, fmt.Errorf("%w: flag %q", ErrInvalid, f)
		}
		for i := 0; i < len(f); i++ {
			if f[i] < 0x21 || f[i] > 0x7e {
				return nil, fmt.Errorf("%w: flag %q", ErrInvalid, f)
			}
		}
		out = append(out, f)
	}
	sort.Strings(out)
	return slices.Compact(out), nil
}

// ApplyFlags returns the flags a message has after a FlagChange's op with
// the (normalized) flags is applied to its current (normalized) flags.
func ApplyFlags(cur []string, op FlagOp, flags []string) []string {
	switch op {
	case FlagsReplace:
		return flags
	case FlagsAdd:
		out := append(slices.Clone(cur), flags...)
		sort.Strings(out)
		return slices.Compact(out)
	default:
		var out []string
		for _, f := range cur {
			if !slices.Contains(flags, f) {
				out = append(out, f)
			}
		}
		return out
	}
}
