package e2e

// The robustness harness's nemesis: failures injected on a schedule drawn
// from the run's seeded RNG (elapsed run time, as Jepsen's nemesis does,
// never a sleep that stands in for a condition), each only after the
// clients have made progress since the previous one.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/history"
)

// Nemesis actions, as counted in the report.
const (
	actKillQuill     = "kill -9 quill node, restart"
	actPauseQuill    = "SIGSTOP quill node, SIGCONT"
	actKillCassandra = "kill -9 cassandra node, restart"
	actPartition     = "partition quill node"
	actAddNode       = "add quill node"
)

var nemesisActions = []string{actKillQuill, actPauseQuill, actKillCassandra, actPartition, actAddNode}

// actionNames are the names QUILL_ROBUST_ACTIONS chooses actions by.
var actionNames = map[string]string{
	"kill-quill": actKillQuill, "pause-quill": actPauseQuill, "kill-cassandra": actKillCassandra,
	"partition": actPartition, "add-node": actAddNode,
}

// chosenActions returns the actions QUILL_ROBUST_ACTIONS names
// (comma-separated actionNames), or every action when it is unset.
func chosenActions(t *testing.T) []string {
	env := os.Getenv("QUILL_ROBUST_ACTIONS")
	if env == "" {
		return nemesisActions
	}
	var out []string
	for _, name := range strings.Split(env, ",") {
		act, ok := actionNames[strings.TrimSpace(name)]
		if !ok {
			t.Fatalf("QUILL_ROBUST_ACTIONS: no action %q", name)
		}
		out = append(out, act)
	}
	return out
}

// nemesis injects failures into one run. Its methods run on the test
// goroutine, except the Cassandra restart, which runs in its own
// goroutine and reports through cassDone.
type nemesis struct {
	t       *testing.T
	r       *rand.Rand
	rec     *history.Recorder
	nodes   *robustNodes
	c       *cassandraCluster
	fw      *firewall // nil: partitions unavailable (logged once)
	newNode func() *Server
	maxNode int // how many Quill nodes the run may have

	counts   map[string]int
	skipped  map[string]string // action -> why it cannot run here
	mu       sync.Mutex
	cassDown string         // the Cassandra node being restarted, "" if none
	cassDone chan error     // the restart's outcome
	cassTook time.Duration  // how long the last restart took
	cassLog  []string       // restart durations, for the report
	events   []nemesisEvent // what happened when, for the report
}

type nemesisEvent struct {
	at   history.Time
	what string
}

func (n *nemesis) logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	n.events = append(n.events, nemesisEvent{n.rec.Now(), msg})
	n.t.Logf("nemesis +%v: %s", time.Duration(n.rec.Now()).Round(100*time.Millisecond), msg)
}

// run injects failures until ctx ends: first every action once, in an
// order drawn from the RNG and 2 to 5 s apart (so that a short run sees
// each), then actions drawn at random, 4 to 9 s apart. Before each it
// also waits until the clients have acknowledged minProgress more writes,
// which they must do within stallTimeout.
func (n *nemesis) run(ctx context.Context, minProgress int, stallTimeout time.Duration) error {
	actions := chosenActions(n.t)
	order := make([]string, len(actions))
	for i, j := range n.r.Perm(len(actions)) {
		order[i] = actions[j]
	}
	for step := 0; ; step++ {
		gap := 4*time.Second + time.Duration(n.r.Int64N(int64(5*time.Second)))
		if step < len(order) {
			gap = 2*time.Second + time.Duration(n.r.Int64N(int64(3*time.Second)))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(gap):
		}
		target := n.rec.Acked() + minProgress
		if err := n.rec.WaitAcked(ctx, target, stallTimeout); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("before nemesis step %d: %w", step, err)
		}
		act := actions[n.r.IntN(len(actions))]
		if step < len(order) {
			act = order[step]
		}
		if err := n.do(ctx, act); err != nil {
			return err
		}
	}
}

// do performs one action; one that cannot run now is logged and skipped.
func (n *nemesis) do(ctx context.Context, act string) error {
	if why, ok := n.skipped[act]; ok {
		n.logf("%s: skipped (%s)", act, why)
		return nil
	}
	nodes := n.nodes.all()
	i := n.r.IntN(len(nodes))
	// Faults last 3 to 12 s: past the POP3 maildrop lease (5 s here)
	// and Cassandra's request timeouts, often enough.
	hold := 3*time.Second + time.Duration(n.r.Int64N(int64(9*time.Second)))
	switch act {
	case actKillQuill:
		nodes[i].Kill()
		n.logf("%s q%d", act, i)
		start := time.Now()
		nodes[i].Restart(n.t)
		n.logf("q%d serves again after %v", i, time.Since(start).Round(time.Millisecond))
	case actPauseQuill:
		if err := nodes[i].Pause(); err != nil {
			return err
		}
		n.logf("SIGSTOP q%d for %v", i, hold.Round(time.Millisecond))
		n.hold(ctx, hold)
		if err := nodes[i].Resume(); err != nil {
			return err
		}
		n.logf("SIGCONT q%d", i)
	case actKillCassandra:
		if err := n.pollCassandra(); err != nil {
			return err
		}
		n.mu.Lock()
		down := n.cassDown
		n.mu.Unlock()
		if down != "" {
			n.logf("%s: skipped, cassandra node %s is still restarting", act, down)
			return nil
		}
		node := strconv.Itoa(1 + n.r.IntN(n.c.nodes))
		if err := n.c.run(n.t, "kill", node); err != nil {
			return err
		}
		n.logf("kill -9 cassandra node %s; restarting it in the background", node)
		n.mu.Lock()
		n.cassDown = node
		n.mu.Unlock()
		done := make(chan error, 1)
		n.cassDone = done
		start := time.Now()
		go func() {
			// scripts/cassandra restart waits until the node serves.
			err := n.c.restart(n.t, node, 8*time.Minute)
			n.mu.Lock()
			n.cassTook = time.Since(start)
			n.mu.Unlock()
			done <- err
		}()
	case actPartition:
		// In cluster mode half the cuts leave the store reachable: the
		// node is then cut off from its peers only and lets its lease
		// expire (ownership, isolatedLocked).
		gid, store := nodes[i].opts.Gid, len(n.fw.peerPorts()) == 0 || n.r.IntN(2) == 0
		if err := n.fw.cut(gid, store); err != nil {
			return err
		}
		from := "the other nodes"
		if store {
			from = "cassandra and the other nodes"
		}
		n.logf("cut q%d off from %s for %v", i, from, hold.Round(time.Millisecond))
		n.hold(ctx, hold)
		dropped := n.fw.dropped()
		if err := n.fw.heal(gid); err != nil {
			return err
		}
		n.logf("healed q%d (%d packets dropped)", i, dropped)
	case actAddNode:
		if len(nodes) >= n.maxNode {
			n.logf("%s: skipped, the run has its %d nodes", act, n.maxNode)
			return nil
		}
		start := time.Now()
		s := n.newNode()
		k := n.nodes.add(s)
		n.logf("added q%d (serving after %v)", k, time.Since(start).Round(time.Millisecond))
	}
	n.counts[act]++
	return nil
}

// hold waits d of run time, or until ctx ends: how long a fault lasts.
func (n *nemesis) hold(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// pollCassandra collects a finished background restart, if any.
func (n *nemesis) pollCassandra() error {
	if n.cassDone == nil {
		return nil
	}
	select {
	case err := <-n.cassDone:
		return n.restarted(err)
	default:
		return nil
	}
}

func (n *nemesis) restarted(err error) error {
	n.cassDone = nil
	n.mu.Lock()
	node, took := n.cassDown, n.cassTook
	n.cassDown = ""
	n.mu.Unlock()
	if err != nil {
		return fmt.Errorf("restarting cassandra node %s: %w", node, err)
	}
	n.cassLog = append(n.cassLog, took.Round(time.Second).String())
	n.logf("cassandra node %s serves again after %v", node, took.Round(time.Second))
	return nil
}

// heal ends every fault still in force: a paused node is resumed, cut
// links restored and, with waitCassandra, a restarting Cassandra node
// waited for (within its restart's own bound).
func (n *nemesis) heal(waitCassandra bool) error {
	for _, s := range n.nodes.all() {
		if err := s.Resume(); err != nil {
			return err
		}
	}
	if n.fw != nil {
		if err := n.fw.healAll(); err != nil {
			return err
		}
	}
	if waitCassandra && n.cassDone != nil {
		n.logf("waiting for cassandra node %s to serve again", n.cassDown)
		return n.restarted(<-n.cassDone)
	}
	return nil
}

// firewall cuts Quill nodes off with iptables rules in chains of its own:
// every connection a node opens is marked with its group ID (connmark,
// set on the connection's first packet), and a cut drops the node's
// packets to the Cassandra port and to the other nodes' cluster ports, and
// the packets coming back on its connections. Clients still reach the
// node, as in a partition between a data centre's front and its store.
type firewall struct {
	out, in   string // chain names
	storePort int    // Cassandra's native port, on every node's address
	peerPorts func() []int
	mu        sync.Mutex
	cut_      map[uint32][][]string // rules in force, by group ID
}

// newFirewall creates the chains, or returns why it cannot.
// Its chains are named after name and the process.
func newFirewall(t *testing.T, name string, storePort int, gids []uint32, peerPorts func() []int) (*firewall, error) {
	if os.Getuid() != 0 {
		return nil, errors.New("not root: iptables and group IDs need root")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return nil, errors.New("iptables is not installed (scripts/install-test-deps installs it)")
	}
	tag := strconv.Itoa(os.Getpid())
	f := &firewall{out: name + "-OUT-" + tag, in: name + "-IN-" + tag, storePort: storePort, peerPorts: peerPorts, cut_: map[uint32][][]string{}}
	if err := f.ipt("-N", f.out); err != nil {
		return nil, err
	}
	if err := f.ipt("-N", f.in); err != nil {
		_ = f.ipt("-X", f.out)
		return nil, err
	}
	t.Cleanup(func() {
		_ = f.ipt("-D", "OUTPUT", "-j", f.out)
		_ = f.ipt("-D", "INPUT", "-j", f.in)
		for _, c := range []string{f.out, f.in} {
			_ = f.ipt("-F", c)
			if err := f.ipt("-X", c); err != nil {
				t.Errorf("removing iptables chain %s: %v", c, err)
			}
		}
	})
	for _, gid := range gids {
		if err := f.track(gid); err != nil {
			return nil, err
		}
	}
	if err := f.ipt("-I", "OUTPUT", "-j", f.out); err != nil {
		return nil, err
	}
	if err := f.ipt("-I", "INPUT", "-j", f.in); err != nil {
		return nil, err
	}
	return f, nil
}

// track marks the connections a process of group gid opens.
func (f *firewall) track(gid uint32) error {
	g := strconv.FormatUint(uint64(gid), 10)
	return f.ipt("-A", f.out, "-m", "conntrack", "--ctstate", "NEW", "-m", "owner", "--gid-owner", g, "-j", "CONNMARK", "--set-mark", g)
}

func (f *firewall) ipt(args ...string) error {
	out, err := exec.Command("iptables", append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// cut cuts the node of group gid off from the other nodes and, with
// store, from Cassandra.
func (f *firewall) cut(gid uint32, store bool) error {
	g := strconv.FormatUint(uint64(gid), 10)
	var rules [][]string
	for i, p := range append([]int{f.storePort}, f.peerPorts()...) {
		if i == 0 && !store {
			continue
		}
		ps := strconv.Itoa(p)
		rules = append(rules,
			[]string{f.out, "-m", "owner", "--gid-owner", g, "-p", "tcp", "--dport", ps, "-j", "DROP"},
			[]string{f.in, "-m", "connmark", "--mark", g, "-p", "tcp", "--sport", ps, "-j", "DROP"})
		if i > 0 {
			// The node's own cluster listener: its replies to the
			// connections other nodes open; and gossip's datagrams.
			rules = append(rules, []string{f.out, "-m", "owner", "--gid-owner", g, "-p", "tcp", "--sport", ps, "-j", "DROP"},
				[]string{f.out, "-m", "owner", "--gid-owner", g, "-p", "udp", "--dport", ps, "-j", "DROP"},
				[]string{f.out, "-m", "owner", "--gid-owner", g, "-p", "udp", "--sport", ps, "-j", "DROP"},
				[]string{f.in, "-m", "connmark", "--mark", g, "-p", "udp", "--sport", ps, "-j", "DROP"})
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range rules {
		if err := f.ipt(append([]string{"-A"}, r...)...); err != nil {
			return err
		}
		f.cut_[gid] = append(f.cut_[gid], r)
	}
	return nil
}

// dropped returns how many packets the cuts in force have dropped: the
// evidence that a partition was one.
func (f *firewall) dropped() int64 {
	var n int64
	for _, chain := range []string{f.out, f.in} {
		out, err := exec.Command("iptables", "-w", "-L", chain, "-v", "-n", "-x").Output()
		if err != nil {
			return -1
		}
		for _, line := range strings.Split(string(out), "\n") {
			fields := strings.Fields(line)
			if len(fields) > 2 && fields[2] == "DROP" {
				v, _ := strconv.ParseInt(fields[0], 10, 64)
				n += v
			}
		}
	}
	return n
}

func (f *firewall) heal(gid uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.cut_[gid] {
		if err := f.ipt(append([]string{"-D"}, r...)...); err != nil {
			return err
		}
	}
	delete(f.cut_, gid)
	return nil
}

func (f *firewall) healAll() error {
	f.mu.Lock()
	gids := make([]uint32, 0, len(f.cut_))
	for g := range f.cut_ {
		gids = append(gids, g)
	}
	f.mu.Unlock()
	for _, g := range gids {
		if err := f.heal(g); err != nil {
			return err
		}
	}
	return nil
}
