package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// cassandraCluster is a Cassandra cluster a test runs against.
type cassandraCluster struct {
	hosts  []string // contact points, host:port
	nodes  int
	dir    string // the scripts/cassandra DIR; kill and restart need it
	script string // absolute path of scripts/cassandra
}

// useCassandra returns the cluster the test runs against: the running one
// named by QUILL_CASSANDRA_HOSTS (with QUILL_CASSANDRA_NODES and, for tests
// that kill nodes, QUILL_CASSANDRA_DIR: scripts/test shares one 3-node
// cluster between the engine's and these tests), or else a new one that is
// stopped when t ends.
func useCassandra(t *testing.T) *cassandraCluster {
	t.Helper()
	if os.Getenv("QUILL_CASSANDRA") == "off" {
		t.Skip("QUILL_CASSANDRA=off")
	}
	script, err := filepath.Abs(filepath.Join("..", "scripts", "cassandra"))
	if err != nil {
		t.Fatal(err)
	}
	c := &cassandraCluster{nodes: 1, script: script}
	if os.Getenv("QUILL_CASSANDRA_NODES") == "3" {
		c.nodes = 3
	}
	if h := os.Getenv("QUILL_CASSANDRA_HOSTS"); h != "" {
		c.hosts = strings.Split(h, ",")
		c.dir = os.Getenv("QUILL_CASSANDRA_DIR")
		return c
	}
	dir, err := os.MkdirTemp("", "quill-e2e-cassandra-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() {
		stop := exec.Command(script, "stop", dir)
		if out, err := stop.CombinedOutput(); err != nil {
			t.Errorf("stopping cassandra: %v\n%s", err, out)
		}
		if t.Failed() {
			logs, _ := exec.Command(script, "logs", dir).CombinedOutput()
			t.Logf("cassandra logs:\n%s", logs)
		}
		os.RemoveAll(dir)
	})
	ports, err := exec.Command(script, "free-ports", strconv.Itoa(c.nodes)).Output()
	if err != nil {
		t.Fatalf("scripts/cassandra free-ports: %v", err)
	}
	var native, storage int
	if _, err := fmt.Sscan(string(ports), &native, &storage); err != nil {
		t.Fatalf("scripts/cassandra free-ports printed %q: %v", ports, err)
	}
	var stderr bytes.Buffer
	start := exec.Command(script, "start", dir, "--nodes", strconv.Itoa(c.nodes),
		"--native-port", strconv.Itoa(native), "--storage-port", strconv.Itoa(storage))
	start.Stderr = &stderr
	out, err := start.Output()
	if err != nil {
		t.Fatalf("scripts/cassandra start: %v\n%s", err, stderr.String())
	}
	c.hosts = strings.Split(strings.TrimSpace(string(out)), ",")
	return c
}

// run runs scripts/cassandra SUB DIR ARGS... (kill, restart, logs) on c.
func (c *cassandraCluster) run(t testing.TB, sub string, args ...string) error {
	t.Helper()
	return c.runEnv(t, nil, sub, args...)
}

// restart restarts node (scripts/cassandra restart) and allows it within
// to serve again (the script's CASSANDRA_START_TIMEOUT).
func (c *cassandraCluster) restart(t testing.TB, node string, within time.Duration) error {
	t.Helper()
	return c.runEnv(t, []string{fmt.Sprintf("CASSANDRA_START_TIMEOUT=%d", int(within.Seconds()))}, "restart", node)
}

func (c *cassandraCluster) runEnv(t testing.TB, env []string, sub string, args ...string) error {
	t.Helper()
	if c.dir == "" {
		return fmt.Errorf("scripts/cassandra %s: the cluster's directory is unknown (set QUILL_CASSANDRA_DIR with QUILL_CASSANDRA_HOSTS)", sub)
	}
	cmd := exec.Command(c.script, append([]string{sub, c.dir}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/cassandra %s %s: %w\n%s", sub, strings.Join(args, " "), err, out)
	}
	return nil
}

// config writes a quill.toml for the cluster with the given keyspace and
// extra [store.cassandra] lines, and returns its path.
func (c *cassandraCluster) config(t testing.TB, keyspace, extra string) string {
	t.Helper()
	quoted := make([]string, len(c.hosts))
	for i, h := range c.hosts {
		quoted[i] = strconv.Quote(h)
	}
	conf := fmt.Sprintf(`[store]
engine = "cassandra"

[store.cassandra]
hosts = [%s]
keyspace = %q
replication_factor = %d
%s`, strings.Join(quoted, ", "), keyspace, c.nodes, extra)
	path := filepath.Join(t.TempDir(), "quill.toml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCassandraThreeNodesOneMailbox runs three quill serve processes on one
// keyspace and delivers concurrently through all three SMTP listeners into
// one mailbox; then POP3 on one node must show every acknowledged message
// exactly once, byte-exact, in strictly increasing UID order. The user
// and an alias are created by the CLI straight on the keyspace before any
// server runs, and `quill check --config` passes after the servers stop.
func TestCassandraThreeNodesOneMailbox(t *testing.T) {
	c := useCassandra(t)
	cfg := c.config(t, fmt.Sprintf("e2e_%d", os.Getpid()), "")
	// The CLI opens the keyspace itself when no server runs.
	const user, pass = "hot@example.test", "hot-password-1"
	cli := t.TempDir() // a data directory without a server's admin.addr
	mustQuill(t, pass+"\n", "user", "add", user, "--config", cfg, "--data", cli)
	mustQuill(t, "", "alias", "add", "hotter@example.test", user, "--config", cfg, "--data", cli)
	if out := mustQuill(t, "", "user", "list", "--config", cfg, "--data", cli); !strings.Contains(out, user) {
		t.Fatalf("quill user list on cassandra = %q, want %s listed", out, user)
	}
	if out := mustQuill(t, "", "alias", "list", "--config", cfg, "--data", cli); !strings.Contains(out, "hotter@example.test") {
		t.Fatalf("quill alias list on cassandra = %q, want the alias listed", out)
	}
	var servers []*Server
	for i := 0; i < 3; i++ {
		servers = append(servers, startServer(t, Options{ConfigFile: cfg}))
	}

	const each = 15
	type sent struct {
		tok string
		msg []byte
	}
	var (
		mu    sync.Mutex
		acked []sent
		wg    sync.WaitGroup
		errs  = make(chan error, len(servers)*each)
	)
	for i, s := range servers {
		addr := s.Addr("smtp")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < each; j++ {
				tok := fmt.Sprintf("n%d-m%d-%s", i, j, token())
				rcpt := user
				if j%5 == 0 {
					rcpt = "hotter@example.test" // the alias the CLI made
				}
				msg := testMessage("sender@remote.test", rcpt, "cluster "+tok, tok)
				if err := smtpSend(addr, false, "sender@remote.test", []string{rcpt}, msg); err != nil {
					errs <- fmt.Errorf("node %d message %d: %w", i, j, err)
					continue
				}
				mu.Lock()
				acked = append(acked, sent{tok, msg})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(acked) != len(servers)*each {
		t.Fatalf("%d of %d deliveries acknowledged", len(acked), len(servers)*each)
	}
	got := mustFetchAll(t, servers[1].Addr("pop3"), user, pass)
	if len(got) != len(acked) {
		t.Errorf("POP3 on node 1 lists %d messages, want %d", len(got), len(acked))
	}
	for _, a := range acked {
		found := findToken(got, a.tok)
		if len(found) != 1 {
			t.Errorf("message %s present %d times", a.tok, len(found))
			continue
		}
		if err := checkDelivered(found[0], a.msg); err != nil {
			t.Errorf("message %s: %v", a.tok, err)
		}
	}
	for _, s := range servers {
		s.Stop(t)
	}
	out, err := Quill(t, "", "check", "--config", cfg)
	if err != nil || !strings.Contains(out, "store consistent") {
		t.Errorf("quill check --config on the keyspace after the load: %v\n%s", err, out)
	}
}
