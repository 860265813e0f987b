package procs

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const thpEnabled = "/sys/kernel/mm/transparent_hugepage/enabled"

func collapseHeap(interval time.Duration) (HugePages, func()) {
	mode, err := thpMode(thpEnabled)
	switch {
	case err != nil:
		return HugePages{Reason: "transparent huge pages unavailable: " + err.Error()}, func() {}
	case mode != "madvise":
		return HugePages{Reason: "transparent huge pages are " + mode + " on this system"}, func() {}
	}
	if !canCollapse() {
		return HugePages{Reason: "the kernel cannot collapse memory into huge pages (MADV_COLLAPSE, Linux 6.1)"}, func() {}
	}
	_ = collapse()
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				_ = collapse()
			}
		}
	})
	var once sync.Once
	return HugePages{Active: true, Reason: "transparent huge pages are madvise on this system"}, func() {
		once.Do(func() { close(quit) })
		wg.Wait()
	}
}

// thpMode returns the bracketed choice of a THP setting file: "always",
// "madvise" or "never".
func thpMode(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	_, rest, ok := strings.Cut(string(b), "[")
	mode, _, ok2 := strings.Cut(rest, "]")
	if !ok || !ok2 {
		return "", errors.New("unreadable " + path)
	}
	return mode, nil
}

// collapse makes one pass over the process's mappings (see CollapseHeap).
// It collapses each huge page's range of a mapping on its own: over a
// whole mapping, MADV_COLLAPSE gives up at the first range it cannot
// collapse for some reasons, leaving the rest as they were. A range that
// fails (nothing mapped there yet, no huge page to be had now) is left for
// the next pass, and one already collapsed costs only the call; only
// reading the mappings can fail a pass.
func collapse() error {
	maps, err := anonMappings("/proc/self/maps")
	if err != nil {
		return err
	}
	for _, m := range maps {
		if madvise(m, unix.MADV_HUGEPAGE) != nil {
			continue
		}
		for p := (m[0] + hugePage - 1) &^ (hugePage - 1); p+hugePage <= m[1]; p += hugePage {
			_ = madvise([2]uintptr{p, p + hugePage}, unix.MADV_COLLAPSE)
		}
		// Back to no fault-time huge pages, whatever the collapse did.
		_ = madvise(m, unix.MADV_NOHUGEPAGE)
	}
	return nil
}

// canCollapse reports whether the kernel collapses memory on request: it
// collapses one huge page of its own.
func canCollapse() bool {
	b, err := unix.Mmap(-1, 0, 2*hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return false
	}
	defer unix.Munmap(b)
	start := uintptr(unsafe.Pointer(&b[0]))
	aligned := (start + hugePage - 1) &^ (hugePage - 1)
	page := b[aligned-start : aligned-start+hugePage]
	page[0] = 1
	m := [2]uintptr{aligned, aligned + hugePage}
	if madvise(m, unix.MADV_HUGEPAGE) != nil {
		return false
	}
	return madvise(m, unix.MADV_COLLAPSE) == nil
}

// hugePage is the size of a transparent huge page on amd64 and arm64 with
// 4 KiB base pages.
const hugePage = 2 << 20

// anonMappings returns [start, end) of every private, writable,
// anonymous mapping in a /proc/PID/maps file of at least one huge page:
// the Go heap's arenas, the runtime's structures, the binary's .bss, the
// C heap ("[heap]") if there is one; not the main thread's stack or the
// kernel's special mappings. Where the kernel names anonymous memory, the
// Go runtime (1.25 on) names its own "[anon: Go: heap]" and the like.
func anonMappings(path string) ([][2]uintptr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][2]uintptr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// address perms offset dev inode [pathname]
		fields := bytes.SplitN(sc.Bytes(), []byte(" "), 6)
		if len(fields) < 5 {
			continue
		}
		perms := fields[1]
		if len(perms) != 4 || perms[0] != 'r' || perms[1] != 'w' || perms[3] != 'p' || string(fields[4]) != "0" {
			continue
		}
		if len(fields) == 6 {
			name := bytes.TrimSpace(fields[5])
			if len(name) > 0 && string(name) != "[heap]" && !bytes.HasPrefix(name, []byte("[anon:")) {
				continue
			}
		}
		lo, hi, ok := bytes.Cut(fields[0], []byte("-"))
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil || end < start+hugePage {
			continue
		}
		out = append(out, [2]uintptr{uintptr(start), uintptr(end)})
	}
	return out, sc.Err()
}

func madvise(m [2]uintptr, advice int) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, m[0], m[1]-m[0], uintptr(advice)); e != 0 {
		return e
	}
	return nil
}
