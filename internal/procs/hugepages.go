package procs

import (
	"os"
	"time"
)

// HugePagesInterval is how often CollapseHeap passes over the process's
// memory: the heap a pass finds new is backed by huge pages from then on,
// and a pass over memory already backed costs a read of /proc/self/maps
// and a few system calls.
const HugePagesInterval = 10 * time.Second

// HugePages describes what CollapseHeap does on this system.
type HugePages struct {
	// Active is true when it collapses the heap periodically.
	Active bool
	// Reason says why it does or does not.
	Reason string
}

// CollapseHeap backs this process's heap with transparent huge pages (2 MiB
// on amd64) where the kernel leaves them to the application, and returns
// what it does and a stop function, which waits for a pass in progress.
// The environment variable QUILL_HUGEPAGES=off turns it off.
//
// Why: the embedded engine's overlay, its caches and Pebble's memtables are
// hash tables and skiplists of a few hundred MB probed at random, and on
// 4 KiB pages nearly every probe also misses the TLB, which under
// virtualization costs a two-dimensional page walk. Measured under the
// Porcupine mix (docs/adr/0019-performance-record.md, ADR 0012): 0.135 against 0.162 ms
// of CPU per delivered message, the medians of four alternating pairs.
//
// How, on Linux: with /sys/kernel/mm/transparent_hugepage/enabled at
// "madvise" (the kernel gives huge pages only to memory advised so) a
// goroutine passes over the process's private anonymous writable mappings
// every interval, and for each marks it MADV_HUGEPAGE, collapses what is
// already there into huge pages (MADV_COLLAPSE, Linux 6.1) and marks it
// MADV_NOHUGEPAGE again. The collapse, with any compaction it needs, runs
// in that goroutine; the last mark keeps page faults elsewhere from ever
// waiting for a huge page to be compacted ("defrag"), which is what made
// the Go runtime stop advising its heap. With "always" the kernel already
// does it and with "never" the operator has refused it: nothing runs.
// Elsewhere, nothing runs.
func CollapseHeap(interval time.Duration) (HugePages, func()) {
	if os.Getenv("QUILL_HUGEPAGES") == "off" {
		return HugePages{Reason: "QUILL_HUGEPAGES=off"}, func() {}
	}
	return collapseHeap(interval)
}
