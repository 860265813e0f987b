// Package procs holds the process-wide settings of Quill's commands: the
// Go scheduler threads for serving mail from local storage, and a CPU
// profile of the whole process.
package procs

import (
	"os"
	"runtime"
	"runtime/pprof"
)

// Raise doubles GOMAXPROCS unless the GOMAXPROCS environment variable
// sets it, and reports the change. Quill's embedded engine blocks threads
// in file system calls (fdatasync of the WAL, preads of tables the block
// cache misses, table writes) and runs compactions that hold a P for milliseconds; with one P
// per CPU, a P waits for the runtime to hand it off from a blocked thread
// and sessions queue behind a compaction. With twice the Ps the kernel
// interleaves them. Measured under the Porcupine mix on 2 CPUs: 6-9% more
// delivered mail in closed loop, and SMTP p99 halved (20 to 10.5 ms) at
// half the peak rate in open loop; four times the CPUs was worse than
// twice (docs/adr/0019-performance-record.md). The benchmark's durable sinks, which block
// in fdatasync and pread too, gained 2-7%. The default it doubles already follows a
// cgroup CPU limit (Go 1.25); once set, the runtime no longer updates it
// when the limit changes.
func Raise() (from, to int, ok bool) {
	if os.Getenv("GOMAXPROCS") != "" {
		return 0, 0, false
	}
	from = runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(2 * from)
	return from, 2 * from, true
}

// CPUProfile profiles this process into path until the returned stop is
// called; with an empty path both do nothing. stop reports the profile
// file's close.
func CPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
