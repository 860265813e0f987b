package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

var testUsers = []string{"u@example.test"}

func openTestLog(t *testing.T, dir string) *durableLog {
	t.Helper()
	l, err := openDurableLog(dir, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestDurableLogConcurrentAppends appends from many goroutines at once (the
// group commit path, under -race; with noSync, the path without it) and
// reads every record back.
func TestDurableLogConcurrentAppends(t *testing.T) {
	for _, noSync := range []bool{false, true} {
		t.Run(fmt.Sprintf("noSync=%v", noSync), func(t *testing.T) { testConcurrentAppends(t, noSync) })
	}
}

func testConcurrentAppends(t *testing.T, noSync bool) {
	dir := t.TempDir()
	l := openTestLog(t, dir)
	l.noSync = noSync
	const writers, each = 16, 20
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				body := strings.Repeat(fmt.Sprintf("w%d-m%d;", w, i), 1+i*50)
				if _, err := l.Append(t.Context(), testUsers, strings.NewReader(body)); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range readLog(t, filepath.Join(dir, logName)) {
		got[string(r.body)] = true
	}
	if len(got) != writers*each {
		t.Fatalf("%d distinct records read back, want %d", len(got), writers*each)
	}
}

// TestDurableLogCutsTornTail reopens a log whose last record a crash cut
// short: the torn record goes, later appends follow the last whole one.
func TestDurableLogCutsTornTail(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, dir)
	for _, s := range []string{"first", "second"} {
		if _, err := l.Append(t.Context(), testUsers, strings.NewReader(s)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	path := filepath.Join(dir, logName)
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A third record, interrupted halfway through its body.
	torn := append([]byte{20, 0, 0, 0, 1, 2, 3, 4}, "half"...)
	if err := os.WriteFile(path, append(whole, torn...), 0o600); err != nil {
		t.Fatal(err)
	}

	l = openTestLog(t, dir)
	if _, err := l.Append(t.Context(), testUsers, strings.NewReader("third")); err != nil {
		t.Fatal(err)
	}
	l.Close()
	var got []string
	for _, r := range readLog(t, path) {
		got = append(got, string(r.body))
	}
	if want := []string{"first", "second", "third"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("records %q, want %q", got, want)
	}
}

// TestDurableLogFailureIsSticky: a failed write fails its Append and every
// later one, and a closed log acknowledges nothing.
func TestDurableLogFailureIsSticky(t *testing.T) {
	f, err := os.OpenFile("/dev/full", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	l := newDurableLog(f, 0)
	defer l.Close()
	for i := range 2 {
		if _, err := l.Append(t.Context(), testUsers, strings.NewReader("x")); err == nil {
			t.Fatalf("append %d to /dev/full succeeded", i)
		}
	}

	ok := openTestLog(t, t.TempDir())
	ok.Close()
	if _, err := ok.Append(t.Context(), testUsers, strings.NewReader("x")); !errors.Is(err, errLogClosed) {
		t.Fatalf("append after Close: %v, want errLogClosed", err)
	}
}

// TestDurableLogBodyReadError: a body that fails to read writes nothing
// and leaves the log usable.
func TestDurableLogBodyReadError(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, dir)
	boom := errors.New("boom")
	bad := io.MultiReader(strings.NewReader("partial"), iotest.ErrReader(boom))
	if _, err := l.Append(t.Context(), testUsers, bad); !errors.Is(err, boom) {
		t.Fatalf("append of a failing body: %v, want %v", err, boom)
	}
	if _, err := l.Append(t.Context(), testUsers, strings.NewReader("good")); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if got := readLog(t, filepath.Join(dir, logName)); len(got) != 1 || !bytes.Equal(got[0].body, []byte("good")) {
		t.Fatalf("records %+v, want just \"good\"", got)
	}
}
