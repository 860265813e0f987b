package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"quill/internal/cluster/usermap"
)

// managerOf returns the node the user map of a cluster map listing nodes
// (every one of weight 100, drained ones draining) assigns user: what
// quill's ownership protocol makes its manager once it has settled.
func managerOf(t *testing.T, user string, nodes []string, drained ...string) string {
	t.Helper()
	var ms []usermap.Member
	for _, id := range nodes {
		ms = append(ms, usermap.Member{ID: usermap.NodeID(id), Weight: 100, Draining: slices.Contains(drained, id)})
	}
	m, err := usermap.New(1, ms)
	if err != nil {
		t.Fatal(err)
	}
	return string(m.OwnerOf(user))
}

// counter sums the samples of a counter on s's /metrics whose labels
// contain every one of with (`result="ok"`).
func counter(t *testing.T, s *Server, name string, with ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.Addr("admin") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, w := range with {
			ok = ok && strings.Contains(line, w)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// settledOn waits until every server in live reports, in its own status,
// the same map epoch above above, listing the nodes in want, and the
// servers together manage every bucket; it returns the epoch.
func settledOn(t *testing.T, live []*Server, want map[string]string, above uint64, within time.Duration) uint64 {
	t.Helper()
	var epoch uint64
	eventually(t, within, "the cluster settles on one epoch", func() error {
		epoch = 0
		managed := 0
		for _, s := range live {
			st, err := forwardStatus(s)
			if err != nil {
				return err
			}
			if epoch == 0 {
				epoch = st.Epoch
			}
			if st.Epoch != epoch || epoch <= above {
				return fmt.Errorf("epochs %d and %d (want above %d)", epoch, st.Epoch, above)
			}
			for _, n := range st.Nodes {
				if n.ID == st.Self {
					if n.Managed == nil || n.Epoch != epoch {
						return fmt.Errorf("node %s adopted %d, managed %v; epoch %d", n.ID, n.Epoch, n.Managed, epoch)
					}
					managed += *n.Managed
				}
				if w, ok := want[n.ID]; ok && n.State != w {
					return fmt.Errorf("node %s is %s, want %s", n.ID, n.State, w)
				}
			}
		}
		if managed != 4096 {
			return fmt.Errorf("the nodes manage %d buckets", managed)
		}
		return nil
	})
	return epoch
}

// fwdStatus is GET /api/cluster with the ownership fields.
type fwdStatus struct {
	Self  string `json:"self"`
	Epoch uint64 `json:"epoch"`
	Nodes []struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Epoch   uint64 `json:"epoch"`
		Lease   string `json:"lease"`
		Managed *int   `json:"managed"`
	} `json:"nodes"`
}

func forwardStatus(s *Server) (fwdStatus, error) {
	var st fwdStatus
	token, err := os.ReadFile(s.DataDir + "/admin.token")
	if err != nil {
		return st, err
	}
	req, _ := http.NewRequest("GET", "http://"+s.Addr("admin")+"/api/cluster", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return st, fmt.Errorf("GET /api/cluster: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// TestCassandraClusterForwarding: three quill serve processes form a
// cluster on one keyspace and settle on one map epoch. For users managed
// by each node, SMTP deliveries and IMAP APPEND, STORE, MOVE and EXPUNGE
// through every node are applied by the user's manager (forwarded when it
// is another node: the forwarding counters move on every node) and all
// land, checked over IMAP on another node. After kill -9 of one node, a
// delivery for one of its users through a node that does not manage the
// user succeeds once the dead node's lease has expired and the bucket is
// managed elsewhere (the time is reported). `quill cluster drain` then
// moves every bucket of a node away at a new epoch, and a delivery
// through the drained node is forwarded.
func TestCassandraClusterForwarding(t *testing.T) {
	c := useCassandra(t)
	cfg := c.config(t, fmt.Sprintf("e2e_fwd_%d", os.Getpid()), "")
	mustQuill(t, "", "cluster", "init", "--config", cfg)
	first := startServer(t, Options{ConfigFile: cfg, ExtraArgs: []string{"--cluster-addr", "127.0.0.1:0"}})
	servers := []*Server{first}
	for i := 0; i < 2; i++ {
		servers = append(servers, startServer(t, Options{ConfigFile: cfg,
			ExtraArgs: []string{"--cluster-addr", "127.0.0.1:0", "--join", first.Addr("cluster")}}))
	}
	ids := make([]string, len(servers))
	want := map[string]string{}
	for i, s := range servers {
		ids[i] = nodeID(t, s)
		want[ids[i]] = "alive"
	}
	settledOn(t, servers, want, 0, 60*time.Second)

	// A user managed by each node.
	const pass = "forward-password-1"
	var users []string
	per := map[string]int{}
	for i := 0; len(users) < len(ids); i++ {
		u := fmt.Sprintf("fwd%d@example.test", i)
		if m := managerOf(t, u, ids); per[m] == 0 {
			per[m]++
			users = append(users, u)
			addUser(t, first, u, pass)
		}
	}

	// Every node, for every user: a delivery, then an IMAP session that
	// appends two messages, flags everything \Seen, moves one to Archive
	// and expunges the other.
	for _, u := range users { // addUser made INBOX, Archive, Drafts, Junk, Sent, Trash
		for i, s := range servers {
			tok := fmt.Sprintf("%s-n%d", strings.Split(u, "@")[0], i)
			msg := testMessage("sender@remote.test", u, "deliver "+tok, tok)
			if err := smtpSend(s.Addr("smtp"), false, "sender@remote.test", []string{u}, msg); err != nil {
				t.Fatalf("delivery for %s through node %d: %v", u, i, err)
			}
			im := dialIMAP(t, s.Addr("imap"), u, pass)
			for _, kind := range []string{"move", "expunge"} {
				m := testMessage(u, u, kind+" "+tok, tok)
				im.run(t, fmt.Sprintf("APPEND INBOX {%d+}\r\n%s", len(m), m))
			}
			im.run(t, "SELECT INBOX")
			im.run(t, `STORE 1:* +FLAGS (\Seen)`)
			im.run(t, "MOVE "+searchOne(t, im, "move "+tok)+" Archive")
			im.run(t, `STORE `+searchOne(t, im, "expunge "+tok)+` +FLAGS (\Deleted)`)
			im.run(t, "EXPUNGE")
			im.run(t, "LOGOUT")
		}
	}
	check := func(via *Server, nodes int) {
		t.Helper()
		for _, u := range users {
			im := dialIMAP(t, via.Addr("imap"), u, pass)
			inbox, archive := im.subjects(t, "INBOX"), im.subjects(t, "Archive")
			flags := im.flags(t, "INBOX")
			base := strings.Split(u, "@")[0]
			for i := 0; i < nodes; i++ {
				tok := fmt.Sprintf("%s-n%d", base, i)
				if !slices.Contains(inbox, "deliver "+tok) || !slices.Contains(archive, "move "+tok) ||
					slices.Contains(inbox, "expunge "+tok) || slices.Contains(inbox, "move "+tok) {
					t.Fatalf("%s through node %d: INBOX %q, Archive %q", u, i, inbox, archive)
				}
			}
			for i, f := range flags {
				if i < 3 && !strings.Contains(f, `\Seen`) {
					t.Fatalf("%s: INBOX message %d has flags %q, want \\Seen", u, i+1, f)
				}
			}
			im.run(t, "LOGOUT")
		}
	}
	check(servers[1], 3)
	for i, s := range servers {
		sent, applied := counter(t, s, "quill_cluster_forwarded_total", `result="ok"`), counter(t, s, "quill_cluster_forwarded_applied_total", `result="ok"`)
		t.Logf("node %d: %v writes forwarded, %v applied for others", i, sent, applied)
		if sent == 0 || applied == 0 {
			t.Errorf("node %d forwarded %v writes and applied %v forwarded ones; want some of each", i, sent, applied)
		}
	}

	// kill -9 node 2; a user it managed gets a delivery through the node
	// that will not manage it, as soon as one is applied.
	victim := servers[2]
	live := []string{ids[0], ids[1]}
	var vuser string
	for _, u := range users {
		if managerOf(t, u, ids) == ids[2] {
			vuser = u
			break
		}
	}
	via := servers[0]
	if managerOf(t, vuser, live) == ids[0] {
		via = servers[1]
	}
	victim.Kill()
	killed := time.Now()
	tok := "after-kill-" + token()
	var attempts int
	for {
		attempts++
		err := smtpSend(via.Addr("smtp"), false, "sender@remote.test", []string{vuser}, testMessage("sender@remote.test", vuser, tok, tok))
		if err == nil {
			break
		}
		if time.Since(killed) > 60*time.Second {
			t.Fatalf("no delivery for %s within 60s of the kill of its manager: %v", vuser, err)
		}
	}
	failover := time.Since(killed)
	t.Logf("kill -9 of a manager to the first forwarded delivery applied for one of its users: %v (%d attempts)", failover, attempts)
	want[ids[2]] = "dead"
	epoch := settledOn(t, servers[:2], want, 0, 30*time.Second)
	if failover > 15*time.Second {
		t.Errorf("failover took %v; the protocol bounds it near detection + lease term + margin (2s + 3.5s)", failover)
	}

	// Drain node 1: the new epoch gives every bucket to node 0, and a
	// delivery through node 1 is forwarded there.
	mustQuill(t, "", "cluster", "drain", ids[1], "--data", servers[0].DataDir)
	want[ids[1]] = "draining"
	settledOn(t, servers[:2], want, epoch, 30*time.Second)
	st, err := forwardStatus(servers[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if n.ID == ids[1] && (n.Managed == nil || *n.Managed != 0) {
			t.Fatalf("the drained node manages %v buckets", n.Managed)
		}
	}
	before := counter(t, servers[1], "quill_cluster_forwarded_total", `result="ok"`)
	for _, u := range users {
		tok := "drained-" + token()
		if err := smtpSend(servers[1].Addr("smtp"), false, "sender@remote.test", []string{u}, testMessage("sender@remote.test", u, tok, tok)); err != nil {
			t.Fatalf("delivery for %s through the drained node: %v", u, err)
		}
	}
	if after := counter(t, servers[1], "quill_cluster_forwarded_total", `result="ok"`); after < before+float64(len(users)) {
		t.Fatalf("the drained node forwarded %v deliveries, want %d", after-before, len(users))
	}
	table := mustQuill(t, "", "cluster", "status", "--data", servers[0].DataDir)
	if !strings.Contains(table, "EPOCH") || !strings.Contains(table, "this node manages 4096 buckets") {
		t.Fatalf("quill cluster status:\n%s", table)
	}
	check(servers[0], 3)
}

// searchOne returns the sequence number of the one message of the
// selected mailbox whose subject contains s.
func searchOne(t *testing.T, c *imapConn, s string) string {
	t.Helper()
	for _, l := range c.run(t, fmt.Sprintf("SEARCH SUBJECT %q", s)) {
		if f := strings.Fields(l); len(f) == 3 && f[1] == "SEARCH" {
			return f[2]
		}
	}
	t.Fatalf("SEARCH SUBJECT %q found no single message", s)
	return ""
}
