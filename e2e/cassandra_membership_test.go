package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clusterStatus is `quill cluster status --json` (and GET /api/cluster).
type clusterStatus struct {
	Self    string `json:"self"`
	Buckets int    `json:"buckets"`
	Nodes   []struct {
		ID      string `json:"id"`
		Addr    string `json:"addr"`
		State   string `json:"state"`
		Buckets int    `json:"buckets"`
		Load    *struct {
			Sessions int     `json:"sessions"`
			CPU      float64 `json:"cpu"`
		} `json:"load"`
	} `json:"nodes"`
}

// statusCLI runs `quill cluster status --json` against s.
func statusCLI(t *testing.T, s *Server) (clusterStatus, error) {
	t.Helper()
	out, err := Quill(t, "", "cluster", "status", "--json", "--data", s.DataDir)
	if err != nil {
		return clusterStatus{}, fmt.Errorf("%v: %s", err, out)
	}
	var st clusterStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return clusterStatus{}, fmt.Errorf("not one JSON object: %v: %q", err, out)
	}
	return st, nil
}

// statusAPI reads GET /api/cluster of s directly: cheaper than a CLI
// process, for timing.
func statusAPI(s *Server) (clusterStatus, error) {
	token, err := os.ReadFile(filepath.Join(s.DataDir, "admin.token"))
	if err != nil {
		return clusterStatus{}, err
	}
	req, _ := http.NewRequest("GET", "http://"+s.Addr("admin")+"/api/cluster", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return clusterStatus{}, err
	}
	defer resp.Body.Close()
	var st clusterStatus
	if resp.StatusCode != 200 {
		return st, fmt.Errorf("GET /api/cluster: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// expect checks st: the nodes in want with their states, buckets summing
// to the total over the non-dead ones, alive nodes with buckets and a load.
func (st clusterStatus) expect(want map[string]string) error {
	if st.Buckets != 4096 {
		return fmt.Errorf("total buckets %d, want 4096", st.Buckets)
	}
	if len(st.Nodes) != len(want) {
		return fmt.Errorf("%d nodes listed, want %d", len(st.Nodes), len(want))
	}
	sum := 0
	for _, n := range st.Nodes {
		if w, ok := want[n.ID]; !ok || n.State != w {
			return fmt.Errorf("node %s is %q, want %q", n.ID, n.State, w)
		}
		sum += n.Buckets
		if n.State == "alive" && (n.Buckets == 0 || n.Load == nil || n.Addr == "") {
			return fmt.Errorf("alive node %s: %d buckets, load %v, addr %q", n.ID, n.Buckets, n.Load, n.Addr)
		}
		if n.State == "dead" && n.Buckets != 0 {
			return fmt.Errorf("dead node %s has %d buckets", n.ID, n.Buckets)
		}
	}
	if sum != 4096 {
		return fmt.Errorf("buckets sum to %d, want 4096", sum)
	}
	return nil
}

func nodeID(t *testing.T, s *Server) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.DataDir, "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestCassandraClusterMembership: three quill serve processes on one
// keyspace form a cluster with --cluster-addr and --join after `quill
// cluster init` (two at once: one creates, one finds); status on any node
// lists three alive nodes whose buckets sum to 4096; after kill -9 of one,
// status lists it dead within the 2 s detection bound and its buckets on
// the other two. A node refuses to start before the credentials exist, and
// says to run `quill cluster init`.
func TestCassandraClusterMembership(t *testing.T) {
	c := useCassandra(t)
	cfg := c.config(t, fmt.Sprintf("e2e_net_%d", os.Getpid()), "")
	off := []string{"--cluster-addr", "127.0.0.1:0"}
	for _, name := range Listeners {
		off = append(off, "--"+name+"-addr", "off")
	}
	out, err := Quill(t, "", append([]string{"serve", "--config", cfg, "--data", t.TempDir()}, off...)...)
	if err == nil || !strings.Contains(out, "quill cluster init") {
		t.Fatalf("serve with a cluster before init: %v; want a failure naming quill cluster init:\n%s", err, out)
	}

	var wg sync.WaitGroup
	outs := make([]string, 2)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = mustQuill(t, "", "cluster", "init", "--config", cfg)
		}()
	}
	wg.Wait()
	created := 0
	for _, o := range outs {
		if strings.Contains(o, "credentials created") {
			created++
		}
	}
	ca := func(s string) string { i := strings.Index(s, "sha256:"); return s[i : i+71] }
	if created != 1 || ca(outs[0]) != ca(outs[1]) {
		t.Fatalf("two concurrent cluster inits: %q; want one created, one finding the same CA", outs)
	}
	if again := mustQuill(t, "", "cluster", "init", "--config", cfg); !strings.Contains(again, "exist already") || ca(again) != ca(outs[0]) {
		t.Fatalf("third cluster init: %q", again)
	}

	first := startServer(t, Options{ConfigFile: cfg, ExtraArgs: []string{"--cluster-addr", "127.0.0.1:0"}})
	seed := first.Addr("cluster")
	servers := []*Server{first}
	for i := 0; i < 2; i++ {
		servers = append(servers, startServer(t, Options{ConfigFile: cfg, ExtraArgs: []string{"--cluster-addr", "127.0.0.1:0", "--join", seed}}))
	}
	want := map[string]string{}
	for _, s := range servers {
		want[nodeID(t, s)] = "alive"
	}
	if len(want) != 3 {
		t.Fatalf("node IDs not distinct: %v", want)
	}
	for _, s := range servers {
		eventually(t, 30*time.Second, "three alive nodes in quill cluster status --json", func() error {
			st, err := statusCLI(t, s)
			if err != nil {
				return err
			}
			if st.Self != nodeID(t, s) {
				return fmt.Errorf("self %s", st.Self)
			}
			return st.expect(want)
		})
	}
	table := mustQuill(t, "", "cluster", "status", "--data", first.DataDir)
	if !strings.Contains(table, "3 nodes; 4096 of 4096 buckets assigned") {
		t.Fatalf("quill cluster status:\n%s", table)
	}

	// kill -9 the third node; both others must list it dead within the
	// bound, and its buckets on the two of them.
	victim := servers[2]
	vid := nodeID(t, victim)
	victim.Kill()
	killed := time.Now()
	want[vid] = "dead"
	for i, s := range servers[:2] {
		var lastErr error
		for {
			st, err := statusAPI(s)
			if err == nil {
				err = st.expect(want)
			}
			if err == nil {
				break
			}
			lastErr = err
			if time.Since(killed) > 10*time.Second {
				t.Fatalf("node %d does not list the killed node dead within 10s: %v", i, lastErr)
			}
			time.Sleep(20 * time.Millisecond) // paces the polling of an observable condition
		}
		detected := time.Since(killed)
		t.Logf("node %d: kill -9 to status listing the node dead, buckets on the others: %v (at most; bound 2s)", i, detected)
		if detected > 2*time.Second {
			t.Errorf("node %d listed the dead node after %v, over the 2s bound", i, detected)
		}
	}
	st, err := statusCLI(t, servers[1])
	if err == nil {
		err = st.expect(want)
	}
	if err != nil {
		t.Fatalf("quill cluster status --json on the second node after the kill: %v", err)
	}
}
