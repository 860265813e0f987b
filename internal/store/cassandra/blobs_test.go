package cassandra

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"

	"quill/internal/store"
)

// TestExpungeDuringAppendKeepsClaimedBlob is one delivery to two
// recipients whose first copy is expunged (a POP3 DELE+QUIT on another
// node) while the second recipient's Append has checked the blob but not
// yet committed. Before claims, the expunge found no reference and deleted
// the body the second Append then referenced. The claim is taken here by
// claimBlobs, exactly where Append takes it.
func TestExpungeDuringAppendKeepsClaimedBlob(t *testing.T) {
	ctx := context.Background()
	e := openTest(t, newKeyspace(t))
	defer e.Close()
	inboxes := twoInboxes(t, e)
	const body = "Subject: shared\r\n\r\none body, two recipients\r\n"
	blob, n, err := e.PutBlob(ctx, strings.NewReader(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	nm := []store.NewMessage{{Blob: blob, Size: n}}
	first, err := e.Append(ctx, inboxes[0], nm, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unclaim, err := e.claimBlobs(ctx, inboxes[1], []store.ID{blob})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Expunge(ctx, inboxes[0], []uint32{first[0].UID}); err != nil {
		t.Fatal(err)
	}
	second, err := e.Append(ctx, inboxes[1], nm, store.AppendOptions{})
	unclaim()
	if err != nil {
		t.Fatalf("second recipient's append while the first copy was expunged: %v", err)
	}
	if got := readBlob(t, e, blob); got != body {
		t.Fatalf("body after the second append = %q, want %q", got, body)
	}
	if problems, err := e.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
	// The last reference goes, and with it the blob (store contract).
	if _, _, err := e.Expunge(ctx, inboxes[1], []uint32{second[0].UID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.OpenBlob(ctx, blob); !isNotFound(err) {
		t.Fatalf("OpenBlob after the last reference went = %v, want ErrNotFound", err)
	}
	if problems, err := e.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check after the release = %v, %v", problems, err)
	}
}

// TestExpungeRacesAppend runs the race for real: the second recipient's
// Append and the expunge of the first copy start together. Either Append
// fails with ErrNotFound (the delivery answers 451) or it succeeds and the
// body is readable; never a committed message without its body.
func TestExpungeRacesAppend(t *testing.T) {
	ctx := context.Background()
	e := openTest(t, newKeyspace(t))
	defer e.Close()
	inboxes := twoInboxes(t, e)
	won, lost := 0, 0
	for round := range 12 {
		body := fmt.Sprintf("Subject: race %d\r\n\r\nbody\r\n", round)
		blob, n, err := e.PutBlob(ctx, strings.NewReader(body), 0)
		if err != nil {
			t.Fatal(err)
		}
		nm := []store.NewMessage{{Blob: blob, Size: n}}
		first, err := e.Append(ctx, inboxes[0], nm, store.AppendOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var appendErr, expungeErr error
		wg.Go(func() { _, appendErr = e.Append(ctx, inboxes[1], nm, store.AppendOptions{}) })
		wg.Go(func() { _, _, expungeErr = e.Expunge(ctx, inboxes[0], []uint32{first[0].UID}) })
		wg.Wait()
		if expungeErr != nil {
			t.Fatal(expungeErr)
		}
		switch {
		case appendErr == nil:
			won++
			if got := readBlob(t, e, blob); got != body {
				t.Fatalf("round %d: appended message's body = %q, want %q", round, got, body)
			}
		case isNotFound(appendErr):
			lost++
		default:
			t.Fatalf("round %d: Append = %v", round, appendErr)
		}
	}
	t.Logf("append won %d rounds, lost %d (ErrNotFound)", won, lost)
	if problems, err := e.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
}

// TestPutBlobTruncatedBody: a body whose reader fails with
// io.ErrUnexpectedEOF (an SMTP client gone mid-DATA) is a failed PutBlob
// that leaves nothing behind, not a shorter blob.
func TestPutBlobTruncatedBody(t *testing.T) {
	ctx := context.Background()
	e := openTest(t, newKeyspace(t))
	defer e.Close()
	for _, size := range []int{9, chunkSize, chunkSize + 9} {
		body := io.MultiReader(strings.NewReader(strings.Repeat("x", size)), iotest.ErrReader(io.ErrUnexpectedEOF))
		if id, n, err := e.PutBlob(ctx, body, 0); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("PutBlob of a %d-byte truncated body = %v, %d, %v; want io.ErrUnexpectedEOF", size, id, n, err)
		}
	}
	var raw []byte
	if err := e.read(ctx, `SELECT id FROM blobs LIMIT 1`).Scan(&raw); !isDriverNotFound(err) {
		t.Fatalf("a blob row was left behind: %x, %v", raw, err)
	}
	if err := e.read(ctx, `SELECT id FROM blob_chunks LIMIT 1`).Scan(&raw); !isDriverNotFound(err) {
		t.Fatalf("a chunk was left behind: %x, %v", raw, err)
	}
	// Whole bodies of the same sizes, ending exactly on a chunk boundary
	// or not, are stored intact.
	for _, size := range []int{0, 9, chunkSize, 2 * chunkSize, chunkSize + 9} {
		want := strings.Repeat("y", size)
		id, n, err := e.PutBlob(ctx, strings.NewReader(want), 0)
		if err != nil || n != int64(size) {
			t.Fatalf("PutBlob(%d bytes) = %d, %v", size, n, err)
		}
		if got := readBlob(t, e, id); got != want {
			t.Fatalf("blob of %d bytes reads back %d bytes", size, len(got))
		}
		// A body of less than a chunk lives in the blob row alone.
		err = e.read(ctx, `SELECT id FROM blob_chunks WHERE id = ? AND chunk = 0`, id[:]).Scan(&raw)
		if inline := isDriverNotFound(err); inline != (size < chunkSize) {
			t.Fatalf("blob of %d bytes: stored in its row alone: %v (%v)", size, inline, err)
		}
	}
	if problems, err := e.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
}

func twoInboxes(t *testing.T, e *Engine) []store.ID {
	t.Helper()
	var inboxes []store.ID
	for _, u := range []string{"a@example.test", "b@example.test"} {
		if err := e.CreateUser(context.Background(), store.User{Address: u}); err != nil {
			t.Fatal(err)
		}
		mb, err := e.GetMailbox(context.Background(), u, "INBOX")
		if err != nil {
			t.Fatal(err)
		}
		inboxes = append(inboxes, mb.ID)
	}
	return inboxes
}

func readBlob(t *testing.T, e *Engine, id store.ID) string {
	t.Helper()
	r, err := e.OpenBlob(context.Background(), id)
	if err != nil {
		t.Fatalf("OpenBlob: %v", err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 4<<20))
	if err != nil {
		t.Fatalf("reading blob: %v", err)
	}
	return string(b)
}

// BenchmarkIdlePoll is what one IDLE session polling storage costs per
// poll when nothing changed (the common case): the Changes call from its
// last MODSEQ that mailbox.View.Poll makes (a head read, to hide a pending
// operation, and a change log partition read). Reported as polls/s the cluster served with 8
// pollers over 64 mailboxes; the cost of an interval follows from it
// (sessions / interval = polls/s needed).
func BenchmarkIdlePoll(b *testing.B) {
	ctx := context.Background()
	e := openTest(b, newKeyspace(b))
	defer e.Close()
	var ids []store.ID
	var since []uint64
	for i := range 64 {
		u := fmt.Sprintf("idle%d@example.test", i)
		if err := e.CreateUser(ctx, store.User{Address: u}); err != nil {
			b.Fatal(err)
		}
		m, err := e.GetMailbox(ctx, u, "INBOX")
		if err != nil {
			b.Fatal(err)
		}
		blob, n, err := e.PutBlob(ctx, strings.NewReader("Subject: x\r\n\r\nx\r\n"), 0)
		if err != nil {
			b.Fatal(err)
		}
		got, err := e.Append(ctx, m.ID, []store.NewMessage{{Blob: blob, Size: n}}, store.AppendOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ids, since = append(ids, m.ID), append(since, got[0].ModSeq)
	}
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1)) % len(ids)
			changes, err := e.Changes(ctx, ids[i], since[i], 100)
			if err == nil && len(changes) > 0 {
				err = fmt.Errorf("mailbox changed under the benchmark: %v", changes)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "polls/s")
}
