package embedded

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/store"
)

// mountTmpfs mounts a tmpfs of size bytes on a new directory, unmounted at
// cleanup (registered first, so it runs after the engine's Close).
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("mounting a tmpfs is not permitted here (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillFS writes a file that leaves about leave bytes free in dir's file
// system, and returns its name.
func fillFS(t *testing.T, dir string, leave int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "filler")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n := int64(st.Bavail)*st.Bsize - leave; n > 0; {
		w := min(n, int64(len(buf)))
		if _, err := f.Write(buf[:w]); err != nil {
			t.Fatalf("writing the filler: %v", err)
		}
		n -= w
	}
	return name
}

// writable returns quill_store_writable as reg gathers it.
func writable(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "quill_store_writable" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("quill_store_writable not registered")
	return 0
}

// TestDiskFull fills the engine's file system (a tmpfs), with and without a
// reserve: deliveries are refused with store.ErrUnavailable and nothing of
// them is kept, Health and quill_store_writable say so, an expunge still
// succeeds with a reserve, and once space is freed the engine accepts
// deliveries again by itself; every acknowledged body survives a reopen.
// Without a reserve the log write itself meets ENOSPC, mid-record, and
// recoverTail resumes the log.
func TestDiskFull(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reserve int64
	}{{"reserve", 2 << 20}, {"no reserve", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			mnt := mountTmpfs(t, 24<<20)
			dir := filepath.Join(mnt, "store")
			reg := prometheus.NewRegistry()
			opts := Options{ReserveBytes: tc.reserve, LogSegmentBytes: 4 << 20, MemTableBytes: 1 << 20, CacheBytes: 1 << 20, Registerer: reg}
			e, err := Open(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			ctx := context.Background()
			box, bodies := deliverN(t, e, "full@example.test", 4, 1000)
			if w := writable(t, reg); w != 1 {
				t.Fatalf("quill_store_writable = %v before filling, want 1", w)
			}
			filler := fillFS(t, mnt, 1<<20)

			deliver := func(i int) error {
				body := fmt.Sprintf("full %d\r\n%s\r\n", i, strings.Repeat("x", 32<<10))
				msgs, err := e.Append(ctx, box, []store.NewMessage{{Body: []byte(body), Size: int64(len(body))}}, store.AppendOptions{})
				if err == nil {
					bodies[msgs[0].UID] = body
				}
				return err
			}
			i := 0
			for ; ; i++ {
				if i == 1000 {
					t.Fatal("no delivery refused on a full disk")
				}
				if err := deliver(i); err != nil {
					if !errors.Is(err, store.ErrUnavailable) {
						t.Fatalf("delivery %d on a full disk: %v, want store.ErrUnavailable", i, err)
					}
					break
				}
			}
			t.Logf("%d deliveries acknowledged before the disk was full", i)
			if err := deliver(i + 1); !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("second delivery on a full disk: %v, want store.ErrUnavailable", err)
			}
			if h := e.Health(); h.Writable || h.Failed || !strings.Contains(h.Reason, "disk full") {
				t.Fatalf("Health on a full disk = %+v", h)
			}
			if w := writable(t, reg); w != 0 {
				t.Fatalf("quill_store_writable = %v on a full disk, want 0", w)
			}
			if tc.reserve > 0 {
				// The reserve's room takes a deletion.
				var uid uint32
				for uid = range bodies {
					break
				}
				expungeUnless(t, e, box, bodies, func(u uint32) bool { return u != uid })
			}

			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(20 * time.Second)
			for !e.Health().Writable {
				if time.Now().After(deadline) {
					t.Fatalf("still not writable 20 s after space was freed: %+v", e.Health())
				}
				time.Sleep(10 * time.Millisecond) // polling an observable condition
			}
			if w := writable(t, reg); w != 1 {
				t.Fatalf("quill_store_writable = %v after recovery, want 1", w)
			}
			for j := range 20 {
				if err := deliver(i + 2 + j); err != nil {
					t.Fatalf("delivery after space was freed: %v", err)
				}
			}
			e.blog.mu.Lock()
			resumed := e.blog.resumed
			e.blog.mu.Unlock()
			if tc.reserve < 0 && resumed == 0 {
				t.Error("without a reserve no log write failed: the test did not reach recoverTail")
			}
			t.Logf("the log was resumed %d times", resumed)
			opts.Registerer = nil
			reopenVerified(t, e, dir, opts, box, bodies)
		})
	}
}
