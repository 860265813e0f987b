package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/history"
)

// TestCassandraRobustness is the robustness harness (issue 35), in the
// manner of Jepsen and etcd's: Quill nodes on a three-node Cassandra (RF 3,
// QUORUM) serve clients that deliver over SMTP and LMTP, APPEND, STORE
// flags with CONDSTORE, EXPUNGE, MOVE, IDLE, read, and DELE+QUIT over
// POP3, each operation against a random node and recorded with its
// invocation, completion and outcome (internal/history). Meanwhile a
// nemesis (robust_nemesis_test.go) kills -9 and restarts Quill nodes,
// SIGSTOPs one for seconds and resumes it, kills -9 a Cassandra node and
// restarts it, cuts a Quill node off from Cassandra (iptables), and adds
// a fourth Quill node. Afterwards every fault is healed, the final state
// is read until two rounds agree, and history.Check verifies the history:
// no acknowledged message lost or duplicated, bodies byte-exact, per
// client UIDs increasing and never reused, MODSEQ never decreasing, no
// acknowledged flag change, EXPUNGE, DELE+QUIT or MOVE lost.
//
// By default the nodes run without the cluster and share Cassandra's
// ordered mode (conditional updates). QUILL_ROBUST_CLUSTER=1 runs them in
// cluster mode (--cluster-addr, --join: membership, ownership, forwarded
// writes, pending deliveries and change events; robustClusterArgs), on
// the batch mode; the fencing scenario (TestFencingWithoutTombstones,
// internal/store/cassandra) shows this checker failing with fencing off.
//
// It runs in scripts/test's 3-node Cassandra stage (QUILL_CASSANDRA_NODES=3)
// for QUILL_ROBUST_DURATION (default 75s) of load. A long run is the same
// test with a longer duration and a seed (docs/cluster.md):
//
//	QUILL_CASSANDRA_NODES=3 QUILL_ROBUST_DURATION=20m QUILL_ROBUST_SEED=1 \
//	  go test -race -count=1 -timeout 90m -run TestCassandraRobustness -v ./e2e/
//
// Environment: QUILL_ROBUST_DURATION, QUILL_ROBUST_SEED, QUILL_ROBUST_CLIENTS
// (default 6), QUILL_ROBUST_HISTORY (a file to write the history to as
// JSON; a failed run writes it to the temp directory), QUILL_ROBUST_STRICT=1
// (a MOVE interrupted half-way fails the run too), QUILL_ROBUST_CLUSTER=1,
// QUILL_ROBUST_ACTIONS (the nemesis's actions, comma-separated: kill-quill,
// pause-quill, kill-cassandra, partition, add-node; default all).
func TestCassandraRobustness(t *testing.T) {
	duration := 75 * time.Second
	if d := os.Getenv("QUILL_ROBUST_DURATION"); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("QUILL_ROBUST_DURATION: %v", err)
		}
	} else if os.Getenv("QUILL_CASSANDRA_NODES") != "3" {
		t.Skip("needs a 3-node cluster: QUILL_CASSANDRA_NODES=3 (scripts/test runs it in its 3-node step), or QUILL_ROBUST_DURATION set")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("QUILL_ROBUST_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("QUILL_ROBUST_SEED: %v", err)
		}
	}
	clients := 6
	if s := os.Getenv("QUILL_ROBUST_CLIENTS"); s != "" {
		var err error
		if clients, err = strconv.Atoi(s); err != nil || clients < 1 {
			t.Fatalf("QUILL_ROBUST_CLIENTS=%q", s)
		}
	}
	t.Logf("seed %d, %v of load, %d clients (QUILL_ROBUST_SEED=%d reproduces the schedule)", seed, duration, clients, seed)
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))

	c := useCassandra(t)
	cfg := c.config(t, fmt.Sprintf("robust_%d", os.Getpid()), `read_consistency = "QUORUM"
write_consistency = "QUORUM"
serial_consistency = "SERIAL"
idle_poll = "500ms"
maildrop_lease = "5s"
`)
	// A Cassandra node left dead by a failed run would break the next test
	// sharing the cluster: the nemesis's heal waits for its restart, and
	// this brings it back if the test stopped before that.
	nodes := &robustNodes{}
	var nem *nemesis
	t.Cleanup(func() {
		if nem == nil || nem.cassDone == nil {
			return
		}
		if err := nem.restarted(<-nem.cassDone); err != nil {
			t.Errorf("after the test: %v", err)
		}
	})

	const maxNodes = 4
	gidBase := 61000 + uint32(os.Getpid()%400)*10
	clusterArgs, peerPorts := robustClusterArgs(t, cfg, maxNodes)
	newNode := func() *Server {
		i := len(nodes.all())
		s := startServer(t, Options{ConfigFile: cfg, Gid: gidBase + uint32(i), ExtraArgs: clusterArgs(i)})
		s.PinListeners()
		return s
	}
	for range 3 {
		nodes.add(newNode())
	}
	users := []string{"ann@" + DefaultDomain, "ben@" + DefaultDomain, "cat@" + DefaultDomain}
	passwords := map[string]string{}
	for i, u := range users {
		passwords[u] = "robust-pw-" + strconv.Itoa(i)
		addUser(t, nodes.all()[0], u, passwords[u])
	}

	nem = &nemesis{t: t, r: rand.New(rand.NewPCG(r.Uint64(), r.Uint64())), nodes: nodes, c: c, newNode: newNode, maxNode: maxNodes,
		counts: map[string]int{}, skipped: map[string]string{}}
	if c.nodes < 3 {
		nem.skipped[actKillCassandra] = fmt.Sprintf("a %d-node Cassandra cannot lose a node", c.nodes)
	}
	var gids []uint32
	for i := range maxNodes {
		gids = append(gids, gidBase+uint32(i))
	}
	storePort, _ := strconv.Atoi(c.hosts[0][strings.LastIndexByte(c.hosts[0], ':')+1:])
	fw, err := newFirewall(t, "QROBUST", storePort, gids, peerPorts)
	if err != nil {
		nem.skipped[actPartition] = err.Error()
		t.Logf("partitions unavailable on this machine, that action is skipped: %v", err)
	}
	nem.fw = fw

	rec := history.NewRecorder()
	nem.rec = rec
	load, stopLoad := context.WithTimeout(t.Context(), duration)
	defer stopLoad()
	var wg sync.WaitGroup
	// On a failure that ends the test early, the clients stop (each
	// within its operation's bound) before the servers do.
	t.Cleanup(func() { stopLoad(); wg.Wait() })
	for i := range clients {
		cl := &robustClient{id: i, rec: rec, nodes: nodes, users: users, passwords: passwords,
			r: rand.New(rand.NewPCG(r.Uint64(), uint64(i)))}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl.run(load)
		}()
	}
	nemErr := nem.run(load, 5, 3*time.Minute)
	stopLoad()
	wg.Wait()
	loadEnd := rec.Now()
	if nemErr != nil {
		t.Errorf("nemesis: %v", nemErr)
	}

	// Heal everything but a restarting Cassandra node (QUORUM needs two of
	// three), then read the final state until it stops changing:
	// ambiguous operations may still be running on nodes that were
	// paused or cut off.
	if err := nem.heal(false); err != nil {
		t.Fatalf("healing: %v", err)
	}
	// With the cluster on, deliveries recorded as pending (ADR 0034) are
	// acknowledged and applied later: the final state is read once every
	// node's applier has found none left.
	waitNoPending(t, nodes, 3*time.Minute)
	rounds, err := readFinalState(t, rec, nodes, users, passwords)
	if err != nil {
		t.Errorf("final reads: %v", err)
	}
	if err := nem.heal(true); err != nil {
		t.Errorf("healing: %v", err)
	}

	ops := rec.Ops()
	res, err := history.Check(ops)
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	var report strings.Builder
	_ = res.WriteReport(&report, 40)
	t.Logf("load %v, %d operations, final state settled after %d rounds of reads\n%s", time.Duration(loadEnd).Round(time.Second), len(ops), rounds, report.String())
	var acts []string
	for _, a := range nemesisActions {
		acts = append(acts, fmt.Sprintf("%s: %d", a, nem.counts[a]))
	}
	t.Logf("nemesis actions: %s; cassandra restarts took %v", strings.Join(acts, ", "), nem.cassLog)
	for _, a := range nemesisActions {
		if _, skipped := nem.skipped[a]; nem.counts[a] == 0 && !skipped {
			t.Logf("the run ended before the nemesis could %s (the clients' progress paces it)", a)
		}
	}

	fatal := 0
	for inv, n := range res.ByInvariant() {
		if inv != history.MoveNotAtomic || os.Getenv("QUILL_ROBUST_STRICT") == "1" {
			fatal += n
		}
	}
	if n := res.ByInvariant()[history.MoveNotAtomic]; n > 0 {
		t.Logf("%d times clients saw a MOVE that was not atomic across the nodes sharing Cassandra (an interrupted MOVE left both copies, two concurrent MOVEs through two nodes each copied the message, or a STORE through one node during a MOVE through another was lost): a known limit until one manager per user orders its writes (issue 35); QUILL_ROBUST_STRICT=1 fails on it", n)
	}
	if fatal > 0 {
		t.Errorf("%d violations of the client guarantees (seed %d)", fatal, seed)
	}
	// The run must have exercised what it claims to.
	for _, k := range []history.Kind{history.Deliver, history.Append, history.Store, history.Expunge, history.Move, history.Dele, history.Idle} {
		if res.Counts[k][history.Ok] == 0 {
			t.Errorf("no %s was acknowledged during the run", k)
		}
	}
	if res.Acked < 50 {
		t.Errorf("only %d acknowledged messages", res.Acked)
	}
	path := os.Getenv("QUILL_ROBUST_HISTORY")
	if path == "" && t.Failed() {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("quill-robust-history-%d.json", seed))
	}
	if path != "" {
		b, err := json.Marshal(struct {
			Seed       uint64              `json:"seed"`
			Ops        []history.Op        `json:"ops"`
			Violations []history.Violation `json:"violations"`
		}{seed, ops, res.Violations})
		if err == nil {
			err = os.WriteFile(path, b, 0o644)
		}
		if err != nil {
			t.Errorf("writing the history: %v", err)
		} else {
			t.Logf("history written to %s", path)
		}
	}
}

// waitNoPending waits until every node reports no bucket with pending
// deliveries (quill_cluster_pending_buckets; nodes without the cluster
// report none), or within passes.
func waitNoPending(t *testing.T, nodes *robustNodes, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := 0.0
		for _, s := range nodes.all() {
			left += scrape(t, s, "quill_cluster_pending_buckets", "")
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("pending deliveries still listed after %v (%v buckets summed over the nodes)", within, left)
			return
		}
		time.Sleep(200 * time.Millisecond) // paces the polling of an observable condition
	}
}

// readFinalState reads every user's INBOX and Archive, with bodies, in
// rounds, until a round reads what the previous one did. Each read is
// retried on another node until it succeeds, within three minutes.
func readFinalState(t *testing.T, rec *history.Recorder, nodes *robustNodes, users []string, passwords map[string]string) (int, error) {
	var prev string
	k := 0
	for round := 1; round <= 8; round++ {
		var state strings.Builder
		for _, u := range users {
			for _, mb := range []string{"INBOX", "Archive"} {
				deadline := time.Now().Add(3 * time.Minute)
				for {
					all := nodes.all()
					s := all[k%len(all)]
					node := "q" + strconv.Itoa(k%len(all))
					k++
					op, err := finalRead(t.Context(), rec, node, s.Addrs(), u, passwords[u], mb)
					if err == nil {
						fmt.Fprintf(&state, "%s/%s %d:", u, mb, op.View.UIDValidity)
						for _, m := range op.View.Messages {
							flags := slices.Clone(m.Flags)
							slices.Sort(flags)
							fmt.Fprintf(&state, " %d=%s%v", m.UID, m.Token, flags)
						}
						state.WriteByte('\n')
						break
					}
					if time.Now().After(deadline) {
						return round, fmt.Errorf("reading %s/%s: %w", u, mb, err)
					}
				}
			}
		}
		if state.String() == prev {
			return round, nil
		}
		prev = state.String()
	}
	return 8, fmt.Errorf("the final state still changed after 8 rounds of reads")
}

// clusterPort returns a port free for TCP and for UDP on 127.0.0.1, held
// for neither (a node binds both), and not in taken. It is taken below the
// kernel's ephemeral range where that leaves room (as scripts/cassandra's
// free-ports): the port of a node added late in the run, or of one killed
// until its restart, stays free for a while, and an outgoing connection
// given it as its local port would make the node fail to bind.
func clusterPort(t *testing.T, taken []int) int {
	t.Helper()
	low := 0
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			low, _ = strconv.Atoi(f[0])
		}
	}
	for range 200 {
		p := 0
		if low > 11000 {
			p = 10000 + rand.IntN(low-10000)
		} else {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			p = ln.Addr().(*net.TCPAddr).Port
			ln.Close()
		}
		if slices.Contains(taken, p) {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		if pc, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			pc.Close()
			return p
		}
	}
	t.Fatal("no free port for a cluster listener")
	return 0
}

// robustClusterArgs is the switch for cluster mode (issue 35's
// --cluster-addr and --join). Without QUILL_ROBUST_CLUSTER=1 the nodes run
// as single nodes sharing Cassandra, and it returns no arguments. With it,
// it requires a `quill serve` that has --cluster-addr, creates the
// cluster's credentials once (`quill cluster init`), gives node i a
// cluster listener (TCP and UDP) on a free port and has every node join
// node 0; the second function returns those ports, which a partition also
// cuts.
func robustClusterArgs(t *testing.T, cfg string, maxNodes int) (func(i int) []string, func() []int) {
	if os.Getenv("QUILL_ROBUST_CLUSTER") != "1" {
		return func(int) []string { return nil }, func() []int { return nil }
	}
	help, _ := Quill(t, "", "serve", "-h")
	if !strings.Contains(help, "-cluster-addr") || !strings.Contains(help, "-join") {
		t.Fatalf("QUILL_ROBUST_CLUSTER=1, but this quill serve has no --cluster-addr and --join:\n%s", help)
	}
	mustQuill(t, "", "cluster", "init", "--config", cfg, "--data", t.TempDir())
	ports := make([]int, maxNodes)
	for i := range ports {
		ports[i] = clusterPort(t, ports[:i])
	}
	args := func(i int) []string {
		a := []string{"--cluster-addr", "127.0.0.1:" + strconv.Itoa(ports[i])}
		if i > 0 {
			a = append(a, "--join", "127.0.0.1:"+strconv.Itoa(ports[0]))
		}
		return a
	}
	return args, func() []int { return ports }
}
