package embedded

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"quill/internal/store"
)

// TestPowerLoss simulates losing power while deliveries and readers run:
// the filesystem is cloned as a crash would leave it (everything synced,
// plus a random share of what was not), and the store reopened on the
// clone must hold every append that was acknowledged before the crash,
// byte-exact, and every UID a reader had observed (a UID once seen is never
// handed out again). A kill -9 cannot show this: the kernel keeps the
// process's unsynced writes.
//
// With checkpoints every millisecond the crash strikes while checkpoints
// apply the overlay to memtables that are not yet flushed; with the
// default interval most acknowledged writes are in the overlay alone.
func TestPowerLoss(t *testing.T) {
	for _, unsynced := range []int{0, 50, 100} {
		for _, every := range []time.Duration{time.Millisecond, 0} {
			name := "default"
			if every > 0 {
				name = every.String()
			}
			t.Run(fmt.Sprintf("unsynced%d/checkpoint-%s", unsynced, name), func(t *testing.T) {
				powerLoss(t, unsynced, int64(unsynced)+1, every)
			})
		}
	}
}

type acked struct {
	mailbox store.ID
	uid     uint32
	body    string
}

func powerLoss(t *testing.T, unsyncedPercent int, seed int64, checkpointEvery time.Duration) {
	ctx := context.Background()
	fs := vfs.NewCrashableMem()
	// A 1 MiB memtable and 128 KiB log segments make memtables flush and
	// the log rotate many times during the run, and the writers expunge
	// two messages in three, so the cleaner deletes segments and copies
	// live bodies forward while the crash may strike; a log index of 64
	// blobs in memory freezes segments as well: acknowledged data must
	// survive all of those transitions too.
	e, err := Open("/quill", Options{FS: fs, MemTableBytes: 1 << 20, LogSegmentBytes: 128 << 10, CheckpointInterval: checkpointEvery, LogIndexBlobs: 64})
	if err != nil {
		t.Fatal(err)
	}
	const users = 4
	var boxes []store.ID
	for i := 0; i < users; i++ {
		u := fmt.Sprintf("u%d@example.test", i)
		if err := e.CreateUser(ctx, store.User{Address: u}); err != nil {
			t.Fatal(err)
		}
		m, _ := e.GetMailbox(ctx, u, "INBOX")
		boxes = append(boxes, m.ID)
	}

	var mu sync.Mutex // orders acknowledgements and observations against the crash
	var acks, expunged []acked
	observed := map[store.ID]map[uint32]bool{}
	var crashed *vfs.MemFS
	var crashAcks, crashExpunged []acked
	var crashObserved map[store.ID][]uint32
	stop := make(chan struct{})

	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				box := boxes[rng.IntN(users)]
				body := fmt.Sprintf("writer %d message %d %s\r\n", w, i, strings.Repeat("x", rng.IntN(64<<10)))
				// Every other message goes inline with its append; the rest
				// through PutBlob first.
				nm := store.NewMessage{Body: []byte(body), Size: int64(len(body))}
				if i%2 == 0 {
					id, n, err := e.PutBlob(ctx, strings.NewReader(body), 0)
					if err != nil {
						t.Error(err)
						return
					}
					nm = store.NewMessage{Blob: id, Size: n}
				}
				msgs, err := writer(e).Append(ctx, box, []store.NewMessage{nm}, store.AppendOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				a := acked{box, msgs[0].UID, body}
				if i%3 == 0 {
					mu.Lock()
					acks = append(acks, a)
					mu.Unlock()
					continue
				}
				if _, _, err := writer(e).Expunge(ctx, box, []uint32{a.uid}); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				expunged = append(expunged, a)
				mu.Unlock()
			}
		}(w)
	}
	wg.Add(1)
	go func() { // a reader, as an IMAP or POP3 session would be
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, box := range boxes {
				msgs, err := e.ListMessages(ctx, box, 1, 1<<20)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if observed[box] == nil {
					observed[box] = map[uint32]bool{}
				}
				for _, m := range msgs {
					observed[box][m.UID] = true
				}
				mu.Unlock()
			}
		}
	}()

	// Crash once enough has been acknowledged.
	crashAt := 150 + int(seed%100)
	for crashed == nil {
		mu.Lock()
		if len(acks) >= crashAt {
			crashed = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsyncedPercent, RNG: rand.New(rand.NewPCG(uint64(seed), 99))})
			crashAcks = append([]acked(nil), acks...)
			crashExpunged = append([]acked(nil), expunged...)
			crashObserved = map[store.ID][]uint32{}
			for box, uids := range observed {
				for uid := range uids {
					crashObserved[box] = append(crashObserved[box], uid)
				}
			}
		}
		mu.Unlock()
		if t.Failed() {
			break
		}
	}
	close(stop)
	wg.Wait()
	ls := e.blog.Stats()
	t.Logf("before closing: %d log segments, %d deleted, %d bytes moved", ls.Segments, ls.Removed, ls.Moved)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if crashed == nil {
		t.FailNow()
	}

	e2, err := Open("/quill", Options{FS: crashed, MemTableBytes: 1 << 20})
	if err != nil {
		t.Fatalf("reopening after the crash: %v", err)
	}
	defer e2.Close()
	for _, a := range crashAcks {
		m, err := e2.GetMessage(ctx, a.mailbox, a.uid)
		if err != nil {
			t.Fatalf("acknowledged message %s/%d lost: %v", a.mailbox, a.uid, err)
		}
		r, err := e2.OpenBlob(ctx, m.Blob)
		if err != nil {
			t.Fatalf("body of acknowledged message %s/%d lost: %v", a.mailbox, a.uid, err)
		}
		b, err := io.ReadAll(r)
		if err != nil || string(b) != a.body {
			t.Fatalf("body of %s/%d differs after the crash (%d bytes, %v)", a.mailbox, a.uid, len(b), err)
		}
	}
	for _, a := range crashExpunged {
		if _, err := e2.GetMessage(ctx, a.mailbox, a.uid); err == nil {
			t.Fatalf("message %s/%d, expunged before the crash, is back", a.mailbox, a.uid)
		}
	}
	seen := 0
	expungedUIDs := map[acked]bool{}
	for _, a := range expunged {
		expungedUIDs[acked{mailbox: a.mailbox, uid: a.uid}] = true
	}
	for box, uids := range crashObserved {
		for _, uid := range uids {
			if expungedUIDs[acked{mailbox: box, uid: uid}] {
				continue
			}
			if _, err := e2.GetMessage(ctx, box, uid); err != nil {
				t.Fatalf("UID %d of %s was seen by a reader before the crash and is gone after it: %v", uid, box, err)
			}
			seen++
		}
	}
	if problems, err := e2.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check after the crash: %v %v", problems, err)
	}
	t.Logf("crash after %d acknowledged appends and %d expunges; %d UIDs seen by the reader; all present", len(crashAcks), len(crashExpunged), seen)
}
