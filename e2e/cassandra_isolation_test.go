package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCassandraClusterIsolatedNodeStepsAside (issue 35, failure semantics):
// one node of three is cut off from the other two but not from Cassandra
// (iptables on its group ID). The other two must settle on a map without
// it in which they manage every bucket, within 15 s of the cut, and then
// take an IMAP APPEND for every user, whichever node managed it before;
// after the heal the three settle on one map again and the node that was
// cut off serves every user. Before, the cut-off node kept renewing its
// lease, every node kept it in the map, and every write for its users
// through the others failed until the heal.
func TestCassandraClusterIsolatedNodeStepsAside(t *testing.T) {
	c := useCassandra(t)
	cfg := c.config(t, fmt.Sprintf("e2e_isol_%d", os.Getpid()), "")
	mustQuill(t, "", "cluster", "init", "--config", cfg)
	// Group IDs apart from the robust run's (61000 + 10k + 0..3).
	gidBase := 61000 + uint32(os.Getpid()%400)*10 + 5
	var servers []*Server
	var gids []uint32
	for i := range 3 {
		args := []string{"--cluster-addr", "127.0.0.1:0"}
		if i > 0 {
			args = append(args, "--join", servers[0].Addr("cluster"))
		}
		gids = append(gids, gidBase+uint32(i))
		servers = append(servers, startServer(t, Options{ConfigFile: cfg, Gid: gids[i], ExtraArgs: args}))
	}
	storePort, _ := strconv.Atoi(c.hosts[0][strings.LastIndexByte(c.hosts[0], ':')+1:])
	fw, err := newFirewall(t, "QISOL", storePort, gids, func() []int {
		var ports []int
		for _, s := range servers {
			addr := s.Addr("cluster")
			p, _ := strconv.Atoi(addr[strings.LastIndexByte(addr, ':')+1:])
			ports = append(ports, p)
		}
		return ports
	})
	if err != nil {
		t.Skipf("partitions unavailable on this machine: %v", err)
	}
	want := map[string]string{}
	for _, s := range servers {
		want[nodeID(t, s)] = "alive"
	}
	epoch := settledOn(t, servers, want, 0, 60*time.Second)

	const pass = "isolation-password-1"
	users := make([]string, 12)
	for i := range users {
		users[i] = fmt.Sprintf("isol%d@example.test", i)
		addUser(t, servers[1], users[i], pass)
	}
	appendAll := func(via *Server, what string) {
		t.Helper()
		for _, u := range users {
			msg := testMessage("sender@remote.test", u, what, token())
			if err := appendOnce(via.Addr("imap"), u, pass, msg); err != nil {
				t.Errorf("APPEND for %s through %s %s: %v", u, nodeID(t, via), what, err)
			}
		}
	}
	appendAll(servers[1], "before the cut")

	cut := time.Now()
	if err := fw.cut(gids[0], false); err != nil {
		t.Fatal(err)
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			if err := fw.heal(gids[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer heal()
	want[nodeID(t, servers[0])] = "dead"
	epoch = settledOn(t, servers[1:], want, epoch, 60*time.Second)
	took := time.Since(cut)
	t.Logf("a node cut off from its peers but not from the store: the others manage every bucket %v after the cut (%d packets dropped)",
		took.Round(time.Millisecond), fw.dropped())
	if took > 15*time.Second {
		t.Errorf("the others took every bucket %v after the cut; want within 15 s", took)
	}
	appendAll(servers[1], "during the cut")
	appendAll(servers[2], "during the cut")

	heal()
	want[nodeID(t, servers[0])] = "alive"
	settledOn(t, servers, want, epoch, 60*time.Second)
	appendAll(servers[0], "after the heal")
}
