package loadgen

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTicks is USER_HZ, the unit of the times in /proc/PID/stat. Linux
// has fixed it at 100 on every architecture since 2.6 (proc(5)).
const clockTicks = 100

// procStat holds the fields of /proc/PID/stat that CPU accounting needs.
type procStat struct {
	pid, ppid int
	// ticks is utime + stime + cutime + cstime: the process's own CPU
	// time and that of its children it has waited for.
	ticks uint64
}

// parseProcStat parses one /proc/PID/stat line (proc(5)). The command name
// (field 2) is in parentheses and may itself contain spaces and
// parentheses, so the fields are counted after its last ')'.
func parseProcStat(b []byte) (procStat, error) {
	var s procStat
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return s, fmt.Errorf("%w: bad /proc stat line", ErrProtocol)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return s, fmt.Errorf("%w: bad pid in /proc stat line", ErrProtocol)
	}
	f := bytes.Fields(b[end+1:])
	// f[0] is field 3 (state); ppid is field 4, utime..cstime fields 14..17.
	if len(f) < 15 {
		return s, fmt.Errorf("%w: short /proc stat line", ErrProtocol)
	}
	s.pid = pid
	if s.ppid, err = strconv.Atoi(string(f[1])); err != nil {
		return s, fmt.Errorf("%w: bad ppid in /proc stat line", ErrProtocol)
	}
	for _, x := range f[11:15] {
		v, err := strconv.ParseUint(string(x), 10, 64)
		if err != nil {
			return s, fmt.Errorf("%w: bad time in /proc stat line", ErrProtocol)
		}
		s.ticks += v
	}
	return s, nil
}

// treeCPU returns the CPU time used so far by process root and all its
// live descendants, including the descendants they have reaped, from one
// scan of /proc. A multi-process server (Postfix's master and its
// daemons, Dovecot's) is measured whole; a process that exits and is
// reaped between two scans moves its time into its parent's cutime and is
// not lost. Time of descendants not yet reaped when they exit is lost
// until the parent reaps them.
func treeCPU(procs map[int]procStat, root int) (time.Duration, bool) {
	if _, ok := procs[root]; !ok {
		return 0, false
	}
	children := make(map[int][]int, len(procs))
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	var ticks uint64
	stack := []int{root}
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		ticks += procs[pid].ticks
		stack = append(stack, children[pid]...)
	}
	return time.Duration(ticks) * time.Second / clockTicks, true
}

// maxProcStat bounds one /proc/PID/stat read; the line is under 1 KiB.
const maxProcStat = 4096

// scanProcs reads the stat line of every process.
func scanProcs() (map[int]procStat, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	procs := make(map[int]procStat, len(ents))
	buf := make([]byte, maxProcStat)
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited since ReadDir
		}
		n, err := f.Read(buf)
		f.Close()
		if err != nil {
			continue
		}
		if s, err := parseProcStat(buf[:n]); err == nil {
			procs[s.pid] = s
		}
	}
	return procs, nil
}

// snapshotCPU returns the CPU time of each named process tree.
func snapshotCPU(roots map[string]int) (map[string]time.Duration, error) {
	if len(roots) == 0 {
		return nil, nil
	}
	procs, err := scanProcs()
	if err != nil {
		return nil, fmt.Errorf("loadgen: reading /proc: %w", err)
	}
	out := make(map[string]time.Duration, len(roots))
	for name, pid := range roots {
		d, ok := treeCPU(procs, pid)
		if !ok {
			return nil, fmt.Errorf("loadgen: process %s (pid %d) is not running", name, pid)
		}
		out[name] = d
	}
	return out, nil
}

// machineTicks returns the CPU time all CPUs have spent busy since boot,
// from the first line of /proc/stat (proc(5)): user, nice, system, irq,
// softirq and steal; idle and iowait are not busy, and guest time is
// already counted in user.
func machineTicks() (uint64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 512)
	n, err := f.Read(buf)
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(buf[:n], []byte("\n"))
	f1 := bytes.Fields(line)
	if len(f1) < 9 || string(f1[0]) != "cpu" {
		return 0, fmt.Errorf("%w: bad /proc/stat cpu line", ErrProtocol)
	}
	var busy uint64
	for i, x := range f1[1:9] {
		v, err := strconv.ParseUint(string(x), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: bad /proc/stat cpu line", ErrProtocol)
		}
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, nil
}

// selfTicks returns this process's CPU time (the generator's), with that of
// the children it has reaped.
func selfTicks() (uint64, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, err
	}
	s, err := parseProcStat(b)
	return s.ticks, err
}

// machineSnap is a reading of the whole machine's and the generator's CPU.
type machineSnap struct {
	busy, self uint64
	ok         bool
}

func snapshotMachine() machineSnap {
	busy, err1 := machineTicks()
	self, err2 := selfTicks()
	return machineSnap{busy: busy, self: self, ok: err1 == nil && err2 == nil}
}

func ticksDuration(t uint64) time.Duration { return time.Duration(t) * time.Second / clockTicks }
