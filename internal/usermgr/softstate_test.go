package usermgr

import (
	"fmt"
	"runtime"
	"testing"

	"quill/internal/store"
)

// BenchmarkSoftStatePerUser reports the manager's memory per active user
// with one mailbox written (issue 35 asks at most 120 bytes; Porcupine
// kept 76 per user plus 44 per mailbox fragment): the heap the manager's
// own tables and records take for b.N users, measured around building
// them as a write does (lock, keep the head, unlock), with the engine's
// reads left out. The names are the caller's (a session's or a
// delivery's), shared, and not counted. The tables' load varies with b.N
// between 7/16 and 7/8: run it at several sizes.
//
//	for n in 100000 150000 200000 250000; do
//		go test -run '^$' -bench SoftStatePerUser -benchtime ${n}x ./internal/usermgr/
//	done
func BenchmarkSoftStatePerUser(b *testing.B) {
	names := make([]string, b.N)
	ids := make([]store.ID, b.N)
	for i := range names {
		names[i] = fmt.Sprintf("user%08d@example.org", i)
		ids[i] = store.NewID()
	}
	m := newManager(nil, b.N+1)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := range b.N {
		u := m.lock(names[i])
		u.epoch = 1
		m.keep(u, head{id: ids[i], uidNext: 2, modSeq: 2})
		m.unlock(u)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "B/user")
	runtime.KeepAlive(m)
	// Alive throughout, so that their freeing does not hide the state.
	runtime.KeepAlive(names)
	runtime.KeepAlive(ids)
}
