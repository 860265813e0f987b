package archtest

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// allowed lists, for each package, the Quill packages its non-test code may
// import. A package missing from this table fails the test, so every new
// package takes a deliberate place in the layering.
var allowed = map[string][]string{
	"cmd/quill": {"internal/admin", "internal/auth", "internal/cluster/credentials", "internal/config", "internal/procs", "internal/server",
		"internal/store", "internal/store/embedded"},
	"cmd/quill-load": {"internal/loadgen", "internal/procs"},
	// The benchmark's sinks and mail floor: Quill's SMTP and POP3 front
	// ends over backends of their own, so they need the front ends'
	// vocabulary (auth, delivery, mail and mailbox error values and types)
	// but never Quill's store.
	"cmd/quill-sink": {"internal/auth", "internal/delivery", "internal/mail", "internal/mailbox", "internal/pop3", "internal/procs",
		"internal/smtp", "internal/textconn"},
	// The benchmark harness: drives loadgen, and loads users straight into
	// a stopped Quill's store (one precomputed hash, as auth.Directory would
	// store them), so it needs the store and auth but no front end.
	"bench/compare": {"internal/auth", "internal/loadgen", "internal/server", "internal/store", "internal/store/embedded"},
	// The Cassandra benchmarks' helpers talk CQL themselves: Cassandra's
	// own insert rate (the yardstick) and dropping their keyspaces.
	"bench/cassinsert":   {},
	"bench/dropkeyspace": {},

	// Composition root: may import everything below it.
	"internal/server": {"internal/admin", "internal/auth", "internal/cluster", "internal/cluster/events", "internal/cluster/forward", "internal/cluster/pending", "internal/config", "internal/delivery", "internal/imap", "internal/load", "internal/mailbox",
		"internal/pop3", "internal/smtp", "internal/store", "internal/store/cassandra", "internal/store/embedded", "internal/textconn",
		"internal/usermgr"},

	// Protocol front ends: domain services through their own interfaces,
	// and the domain packages' types and error values. Never the store.
	"internal/smtp":  {"internal/auth", "internal/delivery", "internal/mail", "internal/textconn"},
	"internal/pop3":  {"internal/auth", "internal/mailbox", "internal/textconn"},
	"internal/imap":  {"internal/auth", "internal/mailbox", "internal/mime", "internal/textconn"},
	"internal/admin": {"internal/auth", "internal/mail", "internal/store"},

	// Domain services.
	"internal/delivery": {"internal/mail", "internal/mime", "internal/store"},
	"internal/mailbox":  {"internal/store"},
	"internal/auth":     {"internal/mail", "internal/store", "internal/textconn"},

	// The user manager: the one ordered writer of a user's mailboxes,
	// above the engines' narrow contracts.
	"internal/usermgr": {"internal/store"},

	// Storage.
	"internal/store":           {},
	"internal/store/embedded":  {"internal/store", "internal/store/embedded/bodylog", "internal/store/embedded/overlay"},
	"internal/store/cassandra": {"internal/store"},
	"internal/store/storetest": {"internal/store"},
	// The embedded engine's parts: they know store's types, never the
	// engine.
	"internal/store/embedded/bodylog": {"internal/store"},
	"internal/store/embedded/overlay": {},

	// Cluster. The user map is pure computation on a membership view. The
	// credentials live in the store (store.Secrets).
	"internal/cluster/usermap":     {},
	"internal/cluster/credentials": {"internal/store"},
	// The node-to-node channel: TLS with the credentials, gRPC and gossip
	// over one listener; the generated RPC service.
	"internal/cluster/transport": {"internal/cluster/credentials"},
	"internal/cluster/clusterpb": {},
	// Change events to the other nodes: the generated Events service, and
	// store IDs.
	"internal/cluster/events": {"internal/cluster/clusterpb", "internal/store"},
	// Membership: memberlist over the transport.
	"internal/cluster/membership": {"internal/cluster/credentials", "internal/cluster/transport"},
	// The ownership protocol (ADR 0024, 0027): map epochs and node leases
	// in the store, the user map over them, the live set from membership.
	"internal/cluster/ownership": {"internal/cluster/membership", "internal/cluster/usermap", "internal/store"},
	// The node's part of the cluster: starts the pieces above in order,
	// serves the Node RPC service, computes the status view.
	"internal/cluster": {"internal/cluster/clusterpb", "internal/cluster/credentials", "internal/cluster/events", "internal/cluster/membership",
		"internal/cluster/ownership", "internal/cluster/transport", "internal/cluster/usermap", "internal/load", "internal/store"},
	// Forwarded writes: the store that routes each mailbox write to the
	// user's manager, and the handler that applies what others forward.
	// Pending deliveries' applier (ADR 0034): over the store's records,
	// the user manager and the ownership, both behind interfaces.
	"internal/cluster/pending": {"internal/store"},
	"internal/cluster/forward": {"internal/cluster/clusterpb", "internal/cluster/ownership", "internal/cluster/usermap", "internal/store"},

	// Leaves.
	"internal/config":   {"internal/mail"},
	"internal/textconn": {},
	// The node's own load and its overload decision.
	"internal/load":                  {},
	"internal/textconn/textconntest": {},
	"internal/procs":                 {},
	"internal/mail":                  {},
	"internal/mime":                  {},
	"internal/loadgen":               {},
	"internal/history":               {},
	"internal/archtest":              {},
	"e2e":                            {},
}

func TestImportsPointDownward(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		rel = filepath.ToSlash(rel)
		seen[rel] = true
		ok, known := allowed[rel]
		if !known {
			t.Errorf("%s: package has no entry in the layering table (internal/archtest)", rel)
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			dep, isQuill := strings.CutPrefix(p, "quill/")
			if !isQuill {
				continue
			}
			if !contains(ok, dep) {
				t.Errorf("%s imports %s, which the layering does not allow", filepath.Join(rel, filepath.Base(path)), dep)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for pkg := range allowed {
		if !seen[pkg] && pkg != "e2e" {
			stale = append(stale, pkg)
		}
	}
	sort.Strings(stale)
	for _, pkg := range stale {
		t.Errorf("layering table names %s, which has no Go code", pkg)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
