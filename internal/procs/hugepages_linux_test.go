package procs

import (
	"bufio"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestThpMode(t *testing.T) {
	dir := t.TempDir()
	for in, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never\n": "always",
		"always madvise [never]\n": "never",
	} {
		p := filepath.Join(dir, "enabled")
		if err := os.WriteFile(p, []byte(in), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := thpMode(p); err != nil || got != want {
			t.Errorf("thpMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := thpMode(filepath.Join(dir, "missing")); err == nil {
		t.Error("thpMode of a missing file: no error")
	}
}

func TestAnonMappings(t *testing.T) {
	maps := `00400000-00a00000 r-xp 00000000 fd:00 123 /usr/bin/quill
00a00000-00c00000 rw-p 00600000 fd:00 123 /usr/bin/quill
00c00000-01000000 rw-p 00000000 00:00 0
01000000-01100000 rw-p 00000000 00:00 0
01400000-01800000 rw-p 00000000 00:00 0                                  [heap]
c000000000-c004000000 rw-p 00000000 00:00 0
c004000000-c008000000 rw-p 00000000 00:00 0                              [anon: Go: heap]
c008000000-c00c000000 ---p 00000000 00:00 0
7e0000000000-7e0000400000 rw-p 00000000 00:00 0                          [anon_shmem: x]
7f0000000000-7f0000400000 rw-s 00000000 00:01 77 /dev/zero (deleted)
7f0000400000-7f0000800000 r--p 00000000 00:00 0
7ffd00000000-7ffd00400000 rw-p 00000000 00:00 0                          [stack]
7ffd00400000-7ffd00402000 r--p 00000000 00:00 0                          [vvar]
garbage line
`
	p := filepath.Join(t.TempDir(), "maps")
	if err := os.WriteFile(p, []byte(maps), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := anonMappings(p)
	if err != nil {
		t.Fatal(err)
	}
	// Not the binary's file-backed data, a mapping under one huge page,
	// a shared or unwritable one, or a thread stack.
	want := [][2]uintptr{{0x00c00000, 0x01000000}, {0x01400000, 0x01800000}, {0xc000000000, 0xc004000000}, {0xc004000000, 0xc008000000}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("anonMappings = %x, want %x", got, want)
	}
}

// On a system that leaves huge pages to the application, a pass backs a
// large, fully written heap allocation with huge pages and leaves its
// mapping marked against fault-time huge pages.
func TestCollapseHeap(t *testing.T) {
	if mode, err := thpMode(thpEnabled); err != nil || mode != "madvise" {
		t.Skipf("transparent huge pages: %q, %v; CollapseHeap acts only on madvise", mode, err)
	}
	if !canCollapse() {
		t.Skip("this kernel cannot collapse memory (MADV_COLLAPSE)")
	}
	b := make([]byte, 64<<20)
	for i := range b {
		if i%4096 == 0 {
			b[i] = 1
		}
	}
	if err := collapse(); err != nil {
		t.Fatal(err)
	}
	huge, flags := smapsOf(t, uintptr(unsafe.Pointer(&b[0])))
	if huge < 32<<20 {
		t.Errorf("%d KiB of a 64 MiB written allocation in huge pages, want at least half", huge>>10)
	}
	if !strings.Contains(" "+flags+" ", " nh ") || strings.Contains(" "+flags+" ", " hg ") {
		t.Errorf("mapping left with VmFlags %q, want nh (MADV_NOHUGEPAGE) and not hg", flags)
	}
	b[0] = 2 // keep b alive past the collapse

	info, stop := CollapseHeap(time.Hour)
	defer stop()
	if !info.Active {
		t.Errorf("CollapseHeap inactive on a madvise system: %s", info.Reason)
	}
	stop()
	stop() // idempotent
}

func TestCollapseHeapOff(t *testing.T) {
	t.Setenv("QUILL_HUGEPAGES", "off")
	info, stop := CollapseHeap(time.Hour)
	defer stop()
	if info.Active || info.Reason != "QUILL_HUGEPAGES=off" {
		t.Errorf("CollapseHeap with QUILL_HUGEPAGES=off: %+v", info)
	}
}

// smapsOf returns the AnonHugePages bytes and the VmFlags of the mapping
// of this process that holds addr.
func smapsOf(t *testing.T, addr uintptr) (int64, string) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := false
	var huge int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok && !strings.HasSuffix(fields[0], ":") {
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && uint64(addr) >= start && uint64(addr) < end
			continue
		}
		if !in {
			continue
		}
		switch fields[0] {
		case "AnonHugePages:":
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			huge = kb << 10
		case "VmFlags:":
			return huge, strings.Join(fields[1:], " ")
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return 0, ""
}
