package e2e

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// startCassandra starts a throw-away cluster with scripts/cassandra (1 node,
// or 3 with QUILL_CASSANDRA_NODES=3) and stops it when t ends; it returns
// the contact points and the node count. QUILL_CASSANDRA=off skips the test
// explicitly; a cluster that cannot start fails it.
func startCassandra(t *testing.T) ([]string, int) {
	t.Helper()
	if os.Getenv("QUILL_CASSANDRA") == "off" {
		t.Skip("QUILL_CASSANDRA=off")
	}
	nodes := 1
	if os.Getenv("QUILL_CASSANDRA_NODES") == "3" {
		nodes = 3
	}
	dir, err := os.MkdirTemp("", "quill-e2e-cassandra-")
	if err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs(filepath.Join("..", "scripts", "cassandra"))
	if err != nil {
		t.Fatal(err)
	}
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
	native, storage := freeLoopbackPort(t, nodes), freeLoopbackPort(t, nodes)
	var stderr bytes.Buffer
	start := exec.Command(script, "start", dir, "--nodes", strconv.Itoa(nodes),
		"--native-port", strconv.Itoa(native), "--storage-port", strconv.Itoa(storage))
	start.Stderr = &stderr
	out, err := start.Output()
	if err != nil {
		t.Fatalf("scripts/cassandra start: %v\n%s", err, stderr.String())
	}
	return strings.Split(strings.TrimSpace(string(out)), ","), nodes
}

// freeLoopbackPort returns a TCP port free on 127.0.0.1..127.0.0.n.
func freeLoopbackPort(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		free := true
		for i := 2; i <= n && free; i++ {
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", i, port)); err != nil {
				free = false
			} else {
				l.Close()
			}
		}
		if free {
			return port
		}
	}
	t.Fatal("no free loopback port")
	return 0
}

// TestCassandraThreeNodesOneMailbox runs three quill serve processes on one
// keyspace and delivers concurrently through all three SMTP listeners into
// one mailbox; then POP3 on one node must show every acknowledged message
// exactly once, byte-exact, in strictly increasing UID order.
func TestCassandraThreeNodesOneMailbox(t *testing.T) {
	hosts, nodes := startCassandra(t)
	cfg := filepath.Join(t.TempDir(), "quill.toml")
	quoted := make([]string, len(hosts))
	for i, h := range hosts {
		quoted[i] = strconv.Quote(h)
	}
	conf := fmt.Sprintf(`[store]
engine = "cassandra"

[store.cassandra]
hosts = [%s]
keyspace = "e2e_%d"
replication_factor = %d
`, strings.Join(quoted, ", "), os.Getpid(), nodes)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var servers []*Server
	for i := 0; i < 3; i++ {
		servers = append(servers, startServer(t, Options{ConfigFile: cfg}))
	}
	const user, pass = "hot@example.test", "hot-password-1"
	addUser(t, servers[0], user, pass)

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
				msg := testMessage("sender@remote.test", user, "cluster "+tok, tok)
				if err := smtpSend(addr, false, "sender@remote.test", []string{user}, msg); err != nil {
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
}
