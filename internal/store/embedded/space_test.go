package embedded

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
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
// RecoverTail resumes the log.
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
				msgs, err := writer(e).Append(ctx, box, []store.NewMessage{{Body: []byte(body), Size: int64(len(body))}}, store.AppendOptions{})
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
			resumed := e.blog.Stats().Resumed
			if tc.reserve < 0 && resumed == 0 {
				t.Error("without a reserve no log write failed: the test did not reach RecoverTail")
			}
			t.Logf("the log was resumed %d times", resumed)
			opts.Registerer = nil
			reopenVerified(t, e, dir, opts, box, bodies)
		})
	}
}

// faultFS injects failures into the writes of the body log's segment files
// (mode set by the test): "torn" writes half of what it is given and fails
// with ENOSPC; "whole" writes and syncs all of it, then fails with ENOSPC
// (an fdatasync that reports a lack of space after the data landed, the
// worst case: a whole, valid, unacknowledged record after the end); "eio"
// writes nothing and fails with EIO.
type faultFS struct {
	vfs.FS
	mode atomic.Value // string; "" for none
}

func (fs *faultFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &faultFile{File: f, fs: fs}, nil
}

func (fs *faultFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *faultFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

type faultFile struct {
	vfs.File
	fs *faultFS
}

func (f *faultFile) Write(p []byte) (int, error) {
	switch f.fs.mode.Load() {
	case "torn":
		n, _ := f.File.Write(p[:len(p)/2])
		return n, syscall.ENOSPC
	case "whole":
		n, err := f.File.Write(p)
		if err == nil {
			err = f.File.SyncData()
		}
		return n, errors.Join(err, syscall.ENOSPC)
	case "eio":
		return 0, syscall.EIO
	}
	return f.File.Write(p)
}

// TestLogResumedAfterNoSpace: a log write that fails for lack of space,
// torn or whole, is resumed in process; after a power loss the store holds
// exactly the acknowledged messages (the failed record, even whole and
// synced, is never applied), and the log replays cleanly.
func TestLogResumedAfterNoSpace(t *testing.T) {
	for _, mode := range []string{"torn", "whole"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			mem := vfs.NewCrashableMem()
			fs := &faultFS{FS: mem}
			opts := Options{FS: fs, ReserveBytes: -1}
			e, err := Open("/quill", opts)
			if err != nil {
				t.Fatal(err)
			}
			box, bodies := deliverN(t, e, "u@example.test", 5, 3000)
			body := "never acknowledged\r\n" + strings.Repeat("n", 3000) + "\r\n"
			fs.mode.Store(mode)
			_, err = writer(e).Append(ctx, box, []store.NewMessage{{Body: []byte(body), Size: int64(len(body))}}, store.AppendOptions{})
			fs.mode.Store("")
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("Append whose log write failed with ENOSPC: %v, want store.ErrUnavailable", err)
			}
			deadline := time.Now().Add(20 * time.Second)
			for !e.Health().Writable {
				if time.Now().After(deadline) {
					t.Fatalf("not writable 20 s after the failure: %+v", e.Health())
				}
				time.Sleep(10 * time.Millisecond) // polling an observable condition
			}
			for i := range 3 {
				b := fmt.Sprintf("after %d\r\n%s\r\n", i, strings.Repeat("a", 3000))
				msgs, err := writer(e).Append(ctx, box, []store.NewMessage{{Body: []byte(b), Size: int64(len(b))}}, store.AppendOptions{})
				if err != nil {
					t.Fatalf("Append after the log was resumed: %v", err)
				}
				bodies[msgs[0].UID] = b
			}
			verifyBodies(t, e, box, bodies)
			crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
			e.Close()
			e, err = Open("/quill", Options{FS: crashed, ReserveBytes: -1})
			if err != nil {
				t.Fatalf("reopening after a power loss: %v", err)
			}
			defer e.Close()
			verifyBodies(t, e, box, bodies)
		})
	}
}

// TestLogFailsStopOnEIO: any other write failure stays final until the
// store is reopened, Health says a restart is needed, and the reopened
// store holds every acknowledged message.
func TestLogFailsStopOnEIO(t *testing.T) {
	ctx := context.Background()
	fs := &faultFS{FS: vfs.NewCrashableMem()}
	opts := Options{FS: fs}
	e, err := Open("/quill", opts)
	if err != nil {
		t.Fatal(err)
	}
	box, bodies := deliverN(t, e, "u@example.test", 5, 3000)
	fs.mode.Store("eio")
	appendErr := func() error {
		_, err := writer(e).Append(ctx, box, []store.NewMessage{{Body: []byte("x\r\n"), Size: 3}}, store.AppendOptions{})
		return err
	}
	if err := appendErr(); err == nil || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Append whose log write failed with EIO: %v, want a failure that is not ErrUnavailable", err)
	}
	fs.mode.Store("")
	if h := e.Health(); !h.Failed || h.Writable {
		t.Fatalf("Health after EIO = %+v, want Failed", h)
	}
	// The committer is idle and nothing probes: a later write still fails.
	if err := appendErr(); err == nil {
		t.Fatal("Append after EIO succeeded without a reopen")
	}
	e.Close()
	e, err = Open("/quill", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if h := e.Health(); !h.Writable {
		t.Fatalf("Health after reopening = %+v", h)
	}
	verifyBodies(t, e, box, bodies)
}

// TestPebbleMeetsFullDiskFirst: when a flush of Pebble's memtable is the
// first write to meet the full disk, the reserve's release lets the flush
// finish, the engine enters the full state, and it leaves it once space is
// back.
func TestPebbleMeetsFullDiskFirst(t *testing.T) {
	mnt := mountTmpfs(t, 24<<20)
	dir := filepath.Join(mnt, "store")
	opts := Options{ReserveBytes: 4 << 20, MemTableBytes: 1 << 20, CacheBytes: 1 << 20}
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	box, bodies := deliverN(t, e, "pebble@example.test", 200, 100)
	// Fill every byte left.
	f, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.flush() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("flush on a full disk: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Pebble's flush on a full disk did not finish in 20 s")
	}
	if h := e.Health(); h.Writable || !strings.Contains(h.Reason, "disk full") {
		t.Fatalf("Health after Pebble met the full disk = %+v", h)
	}
	if _, err := writer(e).Append(context.Background(), box, []store.NewMessage{{Body: []byte("x\r\n"), Size: 3}}, store.AppendOptions{}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Append on a full disk: %v, want store.ErrUnavailable", err)
	}
	expungeUnless(t, e, box, bodies, func(uid uint32) bool { return uid%2 == 0 })
	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !e.Health().Writable {
		if time.Now().After(deadline) {
			t.Fatalf("still not writable 20 s after space was freed: %+v", e.Health())
		}
		time.Sleep(10 * time.Millisecond) // polling an observable condition
	}
	reopenVerified(t, e, dir, opts, box, bodies)
}
