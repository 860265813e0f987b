package main

import (
	"bytes"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseIntersperse(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	data := fs.String("data", "", "")
	verbose := fs.Bool("v", false, "")
	quota := fs.Int64("quota", 0, "")
	pos, err := parse(fs, []string{"add", "--data", "/d", "a@example.test", "-v", "--quota=5", "--", "-literal"})
	if err != nil {
		t.Fatal(err)
	}
	if *data != "/d" || !*verbose || *quota != 5 || !slices.Equal(pos, []string{"add", "a@example.test", "-literal"}) {
		t.Fatalf("data=%q v=%v quota=%d pos=%q", *data, *verbose, *quota, pos)
	}
	if _, err := parse(fs, []string{"--nope"}); err == nil {
		t.Fatal("unknown flag accepted")
	}
}

func TestRunUsageAndVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(nil, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage") {
		t.Fatalf("no args: code %d, %q", code, errb.String())
	}
	out.Reset()
	if code := run([]string{"version"}, nil, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "quill ") {
		t.Fatalf("version: code %d, %q", code, out.String())
	}
	errb.Reset()
	if code := run([]string{"serve", "stray"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "stray") {
		t.Fatalf("serve with a stray argument: code %d, %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"user", "frobnicate", "x"}, nil, &out, &errb); code != 2 {
		t.Fatalf("bad user sub-command: code %d, %q", code, errb.String())
	}
}

func TestUserCommandsOnDataDir(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	in := strings.NewReader("a long password\n")
	if code := run([]string{"user", "add", "Alice@Example.test", "--data", dir}, in, &out, &errb); code != 0 {
		t.Fatalf("user add: %d %s", code, errb.String())
	}
	if code := run([]string{"alias", "add", "ali@example.test", "alice@example.test", "--data", dir}, nil, &out, &errb); code != 0 {
		t.Fatalf("alias add: %d %s", code, errb.String())
	}
	out.Reset()
	if code := run([]string{"user", "list", "--data", dir}, nil, &out, &errb); code != 0 || out.String() != "alice@example.test\n" {
		t.Fatalf("user list: %d %q %s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"check", "--data", dir}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "consistent") {
		t.Fatalf("check: %d %q %s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run([]string{"user", "add", "bob@example.test", "--data", dir}, strings.NewReader("short\n"), &out, &errb); code != 1 || !strings.Contains(errb.String(), "8 characters") {
		t.Fatalf("weak password: %d %q", code, errb.String())
	}
}

// TestClusterInitOnce: the first `quill cluster init` creates the
// credentials in the store, the second finds the same CA and changes
// nothing.
func TestClusterInitOnce(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	// The embedded engine opens only an existing data directory.
	if code := run([]string{"user", "add", "a@example.test", "--data", dir}, strings.NewReader("a long password\n"), &out, &errb); code != 0 {
		t.Fatalf("user add: %d %s", code, errb.String())
	}
	out.Reset()
	if code := run([]string{"cluster", "init", "--data", dir}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "created") {
		t.Fatalf("first cluster init: %d %q %s", code, out.String(), errb.String())
	}
	first := out.String()
	ca := first[strings.Index(first, "sha256:"):]
	ca = ca[:strings.IndexByte(ca, ')')]
	out.Reset()
	if code := run([]string{"cluster", "init", "--data", dir}, nil, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "exist already") || !strings.Contains(out.String(), ca) {
		t.Fatalf("second cluster init: %d %q %s; want the first CA %s, unchanged", code, out.String(), errb.String(), ca)
	}
	if code := run([]string{"cluster", "frobnicate"}, nil, &out, &errb); code != 2 {
		t.Fatalf("unknown cluster sub-command: code %d", code)
	}
}
