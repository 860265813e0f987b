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
// own maps and records take for b.N users, measured around building them
// as a write does (lock, load the head, unlock), with the engine's reads
// left out by filling the head directly.
//
//	go test -run '^$' -bench SoftStatePerUser -benchtime 200000x ./internal/usermgr/
func BenchmarkSoftStatePerUser(b *testing.B) {
	names := make([]string, b.N)
	ids := make([]store.ID, b.N)
	for i := range names {
		names[i] = fmt.Sprintf("user%08d@example.org", i)
		ids[i] = store.NewID()
	}
	m := &Manager{owner: soleOwner{}, max: b.N + 1, users: map[string]*user{}, owners: map[store.ID]string{}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := range b.N {
		u := m.lock(names[i])
		u.epoch = 1
		u.heads = append(u.heads, &head{id: ids[i], uidNext: 2, modSeq: 2})
		m.mu.Lock()
		m.owners[ids[i]] = names[i]
		m.mu.Unlock()
		m.unlock(u)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "B/user")
	runtime.KeepAlive(m)
}
