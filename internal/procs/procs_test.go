package procs

import (
	"os"
	"runtime"
	"testing"
)

func TestRaise(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	t.Setenv("GOMAXPROCS", "") // restored after the test
	os.Unsetenv("GOMAXPROCS")
	before := runtime.GOMAXPROCS(0)
	from, to, ok := Raise()
	if !ok || from != before || to != 2*before || runtime.GOMAXPROCS(0) != 2*before {
		t.Fatalf("Raise() = %d, %d, %v; GOMAXPROCS %d, was %d", from, to, ok, runtime.GOMAXPROCS(0), before)
	}

	os.Setenv("GOMAXPROCS", "3")
	runtime.GOMAXPROCS(3)
	if _, _, ok := Raise(); ok || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("Raise with GOMAXPROCS=3 in the environment changed it to %d", runtime.GOMAXPROCS(0))
	}
}

// CPUProfile writes a profile (gzip-compressed protobuf) once stopped; an
// empty path profiles nothing.
func TestCPUProfile(t *testing.T) {
	path := t.TempDir() + "/cpu.pb"
	stop, err := CPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("profile file: %d octets, %v", len(b), err)
	}
	stop, err = CPUProfile("")
	if err != nil || stop() != nil {
		t.Fatalf("CPUProfile(\"\") = %v", err)
	}
}
