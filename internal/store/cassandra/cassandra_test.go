package cassandra

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/store"
	"quill/internal/store/storetest"
)

// The tests run against a real cluster that TestMain starts with
// scripts/cassandra (1 node, or 3 with QUILL_CASSANDRA_NODES=3) and always
// stops. QUILL_CASSANDRA_HOSTS=host:port,... uses a running cluster instead;
// QUILL_CASSANDRA=off skips the package explicitly. Anything else that keeps
// the cluster from starting (no Java, no jars) fails the tests.
var (
	hosts []string
	nodes = 1
	off   bool
)

const helperEnv = "QUILL_CASSANDRA_HELPER"

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	if os.Getenv("QUILL_CASSANDRA") == "off" {
		off = true
		os.Exit(m.Run())
	}
	if n := os.Getenv("QUILL_CASSANDRA_NODES"); n != "" {
		nodes, _ = strconv.Atoi(n)
	}
	if h := os.Getenv("QUILL_CASSANDRA_HOSTS"); h != "" {
		hosts = strings.Split(h, ",")
		os.Exit(m.Run())
	}
	code, err := runWithCluster(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cassandra tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runWithCluster(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "quill-cassandra-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(repoRoot(), "scripts", "cassandra")
	ports, err := exec.Command(script, "free-ports", strconv.Itoa(nodes)).Output()
	if err != nil {
		return 0, fmt.Errorf("scripts/cassandra free-ports: %w", err)
	}
	var native, storage int
	if _, err := fmt.Sscan(string(ports), &native, &storage); err != nil {
		return 0, fmt.Errorf("scripts/cassandra free-ports printed %q: %w", ports, err)
	}
	start := exec.Command(script, "start", dir, "--nodes", strconv.Itoa(nodes),
		"--native-port", strconv.Itoa(native), "--storage-port", strconv.Itoa(storage))
	start.Stderr = os.Stderr
	// Stop whatever started, also when the start failed half-way.
	defer func() {
		stop := exec.Command(script, "stop", dir)
		stop.Stderr = os.Stderr
		if err := stop.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "cassandra tests: stopping the cluster:", err)
		}
	}()
	out, err := start.Output()
	if err != nil {
		return 0, fmt.Errorf("starting a %d-node cluster with %s: %w", nodes, script, err)
	}
	hosts = strings.Split(strings.TrimSpace(string(out)), ",")
	code := m.Run()
	if code != 0 {
		logs := exec.Command(script, "logs", dir)
		logs.Stderr = os.Stderr
		_ = logs.Run()
	}
	return code, nil
}

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Join(wd, "..", "..", "..")
}

var keyspaces atomic.Int64

func testOptions(keyspace string) Options {
	return Options{
		Hosts:    hosts,
		Keyspace: keyspace,
		Replication: map[string]string{
			"class": "SimpleStrategy", "replication_factor": strconv.Itoa(nodes),
		},
	}
}

// newKeyspace returns a fresh keyspace name, dropped when t ends.
func newKeyspace(t testing.TB) string {
	if off {
		t.Skip("QUILL_CASSANDRA=off")
	}
	ks := fmt.Sprintf("qt_%d_%d", os.Getpid(), keyspaces.Add(1))
	t.Cleanup(func() { dropKeyspace(t, ks) })
	return ks
}

func dropKeyspace(t testing.TB, ks string) {
	// Schema changes on a loaded node take longer than a request.
	s, policy, err := Options{Hosts: hosts, Timeout: time.Minute}.withDefaults().session("")
	if err != nil {
		t.Errorf("dropping %s: %v", ks, err)
		return
	}
	defer s.Close()
	defer policy.close()
	if err := s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec(); err != nil {
		t.Errorf("dropping %s: %v", ks, err)
	}
}

func openTest(t testing.TB, ks string) *Engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := Open(ctx, testOptions(ks))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return e
}

// TestConformance runs storetest with a fresh keyspace per subtest. Creating
// a keyspace (a dozen DDL statements, each awaiting schema agreement) is
// the slow part on three loaded nodes, so a warmer migrates the next
// keyspaces while the current subtest runs.
func TestConformance(t *testing.T) {
	if off {
		t.Skip("QUILL_CASSANDRA=off")
	}
	const subtests = 19 // storetest.Run's subtests; more are created on demand
	ctx, cancel := context.WithCancel(context.Background())
	warm := make(chan string, 2)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(warm)
		for i := 0; i < subtests; i++ {
			ks := fmt.Sprintf("qt_%d_%d", os.Getpid(), keyspaces.Add(1))
			e, err := Open(ctx, testOptions(ks))
			if err != nil {
				return // the subtest that needs it creates its own
			}
			e.Close()
			select {
			case warm <- ks:
			case <-ctx.Done():
				dropKeyspace(t, ks)
				return
			}
		}
	}()
	defer func() {
		cancel()
		for ks := range warm {
			dropKeyspace(t, ks)
		}
		wg.Wait()
	}()
	storetest.Run(t, func(t *testing.T) store.Store {
		ks, ok := <-warm
		if !ok {
			return openTest(t, newKeyspace(t))
		}
		t.Cleanup(func() { dropKeyspace(t, ks) })
		return openTest(t, ks)
	})
}

// TestConcurrentOpen opens one new keyspace from several engines at once:
// the migrations must converge on one schema.
func TestConcurrentOpen(t *testing.T) {
	ks := newKeyspace(t)
	var wg sync.WaitGroup
	engines := make([]*Engine, 3)
	errs := make([]error, 3)
	for i := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			engines[i], errs[i] = Open(context.Background(), testOptions(ks))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open %d: %v", i, err)
		}
		defer engines[i].Close()
	}
	if err := engines[0].CreateUser(context.Background(), store.User{Address: "a@example.test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := engines[2].GetUser(context.Background(), "a@example.test"); err != nil {
		t.Fatal(err)
	}
}

// TestRollForward leaves an operation pending, as a process killed between
// its LWT and its row writes would, and checks that the next writer applies
// it and that readers hide it meanwhile.
func TestRollForward(t *testing.T) {
	ctx := context.Background()
	ks := newKeyspace(t)
	opts := testOptions(ks)
	opts.RollForwardAfter = 200 * time.Millisecond
	e, err := Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.CreateUser(ctx, store.User{Address: "r@example.test"}); err != nil {
		t.Fatal(err)
	}
	inbox, err := e.GetMailbox(ctx, "r@example.test", "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	blob, n, err := e.PutBlob(ctx, strings.NewReader("stalled\r\n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	// Commit an append but never apply it.
	o := &op{ID: store.NewID(), Kind: opAppend, ModSeq: 2, Started: time.Now(),
		Before: counters{UIDNext: 1, ModSeq: 1}, After: counters{UIDNext: 2, ModSeq: 2, Messages: 1, Size: n},
		Msgs: []opMsg{{UID: 1, Size: n, Blob: blob, Date: time.Now().UTC().Truncate(time.Millisecond)}}}
	raw := mustJSON(t, o)
	applied, err := e.cas(ctx, `UPDATE mailboxes SET uidnext = 2, modseq = 2, messages = 1, size = ?, pending = ?, recent = ? WHERE id = ? IF pending = null`,
		n, raw, [][]byte{o.ID[:]}, inbox.ID[:]).MapScanCAS(map[string]any{})
	if err != nil || !applied {
		t.Fatalf("committing the stalled op: %v, %v", applied, err)
	}
	// Committed: readers show it at once, from its record.
	if m, err := e.GetMailboxByID(ctx, inbox.ID); err != nil || m.UIDNext != 2 || m.Messages != 1 || m.HighestModSeq != 2 {
		t.Fatalf("mailbox with a pending op = %+v, %v; want it as after the op", m, err)
	}
	if msgs, err := e.ListMessages(ctx, inbox.ID, 1, 10); err != nil || len(msgs) != 1 || msgs[0].Blob != blob || msgs[0].ModSeq != 2 {
		t.Fatalf("messages with a pending append = %+v, %v; want its message", msgs, err)
	}
	blob2, n2, err := e.PutBlob(ctx, strings.NewReader("next\r\n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.Append(ctx, inbox.ID, []store.NewMessage{{Blob: blob2, Size: n2}}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].UID != 2 || got[0].ModSeq != 3 {
		t.Fatalf("append after roll-forward = UID %d MODSEQ %d, want 2, 3", got[0].UID, got[0].ModSeq)
	}
	msgs, err := e.ListMessages(ctx, inbox.ID, 1, 10)
	if err != nil || len(msgs) != 2 || msgs[0].UID != 1 || msgs[0].Blob != blob {
		t.Fatalf("messages = %+v, %v", msgs, err)
	}
	problems, err := e.Check(ctx)
	if err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
}

func TestTableIDsAreDeterministic(t *testing.T) {
	a, b := tableID("ks", "messages"), tableID("ks", "messages")
	if a != b || a == tableID("ks2", "messages") || len(a) != 36 || a[14] != '5' {
		t.Fatalf("tableID = %s, %s", a, b)
	}
}

// TestProcessesAppendConcurrently runs three separate processes (this test
// binary in helper mode) appending to one mailbox while a reader watches;
// then every message is present once, UIDs and MODSEQs strictly increase,
// and no reader ever saw a UID appear below one it had already seen.
func TestProcessesAppendConcurrently(t *testing.T) {
	const procs, each = 3, 40
	ctx := context.Background()
	ks := newKeyspace(t)
	e := openTest(t, ks)
	defer e.Close()
	if err := e.CreateUser(ctx, store.User{Address: "p@example.test"}); err != nil {
		t.Fatal(err)
	}
	inbox, err := e.GetMailbox(ctx, "p@example.test", "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	readerErr := make(chan error, 1)
	go func() {
		seen := map[uint32]bool{}
		var max uint32
		for {
			select {
			case <-stop:
				readerErr <- nil
				return
			default:
			}
			msgs, err := e.ListMessages(ctx, inbox.ID, 1, 1<<20)
			if err != nil {
				readerErr <- err
				return
			}
			for _, m := range msgs {
				if !seen[m.UID] && m.UID < max {
					readerErr <- fmt.Errorf("reader saw UID %d appear after UID %d", m.UID, max)
					return
				}
				seen[m.UID] = true
				max = maxU(max, m.UID)
			}
		}
	}()
	var cmds []*exec.Cmd
	for p := 0; p < procs; p++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=append",
			"QUILL_CASSANDRA_HOSTS="+strings.Join(hosts, ","), "HELPER_KEYSPACE="+ks,
			"HELPER_MAILBOX="+inbox.ID.String(), "HELPER_WRITER="+strconv.Itoa(p), "HELPER_COUNT="+strconv.Itoa(each),
			"HELPER_RF="+strconv.Itoa(nodes))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		defer func() {
			if stderr.Len() > 0 {
				t.Logf("helper %d: %s", p, stderr.String())
			}
		}()
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("helper %d: %v", i, err)
		}
	}
	close(stop)
	if err := <-readerErr; err != nil {
		t.Fatal(err)
	}
	msgs, err := e.ListMessages(ctx, inbox.ID, 1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != procs*each {
		t.Fatalf("%d messages, want %d", len(msgs), procs*each)
	}
	bodies := map[string]bool{}
	for i, m := range msgs {
		if i > 0 && (m.UID <= msgs[i-1].UID || m.ModSeq <= msgs[i-1].ModSeq) {
			t.Fatalf("UID %d/MODSEQ %d listed after UID %d/MODSEQ %d", m.UID, m.ModSeq, msgs[i-1].UID, msgs[i-1].ModSeq)
		}
		r, err := e.OpenBlob(ctx, m.Blob)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if bodies[string(b)] {
			t.Fatalf("body %q stored twice", b)
		}
		bodies[string(b)] = true
	}
	for p := 0; p < procs; p++ {
		for i := 0; i < each; i++ {
			if !bodies[fmt.Sprintf("p%d m%d\r\n", p, i)] {
				t.Fatalf("message %d of process %d lost", i, p)
			}
		}
	}
	problems, err := e.Check(ctx)
	if err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
}

func maxU(a, b uint32) uint32 {
	if a > b {
		return a
	}
	return b
}

// helperMain is a child process of TestProcessesAppendConcurrently.
func helperMain() int {
	ctx := context.Background()
	id, err := store.ParseID(os.Getenv("HELPER_MAILBOX"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad HELPER_MAILBOX")
		return 2
	}
	n, _ := strconv.Atoi(os.Getenv("HELPER_COUNT"))
	w := os.Getenv("HELPER_WRITER")
	e, err := Open(ctx, Options{Hosts: strings.Split(os.Getenv("QUILL_CASSANDRA_HOSTS"), ","), Keyspace: os.Getenv("HELPER_KEYSPACE"),
		Replication: map[string]string{"class": "SimpleStrategy", "replication_factor": os.Getenv("HELPER_RF")}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer e.Close()
	for i := 0; i < n; i++ {
		blob, size, err := e.PutBlob(ctx, strings.NewReader(fmt.Sprintf("p%s m%d\r\n", w, i)), 0)
		if err == nil {
			_, err = e.Append(ctx, id, []store.NewMessage{{Blob: blob, Size: size, InternalDate: time.Now()}}, store.AppendOptions{})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// BenchmarkAppend measures appends per second into one hot mailbox (every
// append contends for the same head LWT) and into many mailboxes.
func BenchmarkAppend(b *testing.B) {
	for _, mailboxes := range []int{1, 64} {
		b.Run(fmt.Sprintf("mailboxes=%d", mailboxes), func(b *testing.B) {
			ctx := context.Background()
			e := openTest(b, newKeyspace(b))
			defer e.Close()
			var ids []store.ID
			for i := 0; i < mailboxes; i++ {
				u := fmt.Sprintf("b%d@example.test", i)
				if err := e.CreateUser(ctx, store.User{Address: u}); err != nil {
					b.Fatal(err)
				}
				m, err := e.GetMailbox(ctx, u, "INBOX")
				if err != nil {
					b.Fatal(err)
				}
				ids = append(ids, m.ID)
			}
			body := strings.Repeat("x", 4096)
			var next atomic.Int64
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := ids[int(next.Add(1))%len(ids)]
					blob, n, err := e.PutBlob(ctx, strings.NewReader(body), 0)
					if err == nil {
						_, err = e.Append(ctx, id, []store.NewMessage{{Blob: blob, Size: n}}, store.AppendOptions{})
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
		})
	}
}

func mustJSON(t *testing.T, o *op) []byte {
	t.Helper()
	raw, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
