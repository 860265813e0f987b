package store

import (
	"errors"
	"slices"
	"testing"
)

func TestNormalizeFlags(t *testing.T) {
	got, err := NormalizeFlags([]string{`\Seen`, "$Label1", `\Seen`, `\Answered`})
	if err != nil || !slices.Equal(got, []string{"$Label1", `\Answered`, `\Seen`}) {
		t.Fatalf("NormalizeFlags = %q, %v", got, err)
	}
	for _, bad := range []string{"", `\Recent`, `\RECENT`, "two words", "paren(", "quote\"", "bracket]", "tab\t", "é", string(make([]byte, 256))} {
		if _, err := NormalizeFlags([]string{bad}); !errors.Is(err, ErrInvalid) {
			t.Errorf("NormalizeFlags(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if got, err := NormalizeFlags(nil); got != nil || err != nil {
		t.Fatalf("NormalizeFlags(nil) = %q, %v", got, err)
	}
}

func TestApplyFlags(t *testing.T) {
	cur := []string{"A", "C"}
	for _, tc := range []struct {
		op   FlagOp
		in   []string
		want []string
	}{
		{FlagsReplace, []string{"B"}, []string{"B"}},
		{FlagsAdd, []string{"B", "C"}, []string{"A", "B", "C"}},
		{FlagsRemove, []string{"C", "D"}, []string{"A"}},
		{FlagsRemove, []string{"A", "C"}, nil},
	} {
		if got := ApplyFlags(cur, tc.op, tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("ApplyFlags(%q, %d, %q) = %q, want %q", cur, tc.op, tc.in, got, tc.want)
		}
	}
	if !slices.Equal(cur, []string{"A", "C"}) {
		t.Fatal("ApplyFlags modified its input")
	}
}
