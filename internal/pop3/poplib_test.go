package pop3

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestPoplib runs Python's poplib against the server: STLS, USER/PASS,
// STAT, LIST, UIDL, RETR, TOP, DELE, QUIT, then AUTH PLAIN in a second
// session. python3 is a test dependency: a missing interpreter fails.
func TestPoplib(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required for this test: %v", err)
	}
	serverTLS, _ := tlsConfigs(t)
	srv := &Server{Hostname: "pop.test", Backend: fixture(), TLSConfig: serverTLS, Logger: testLogger(t)}
	addr := startServer(t, srv, netipAddr("192.0.2.9"))
	_, port, _ := strings.Cut(addr, ":")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, testCertPEM(t), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "testdata/poplib_client.py", port, ca)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("poplib client: %v\n%s", err, stderr.String())
	}
	var got map[string]any
	if err := json.Unmarshal(stdout, &got); err != nil {
		t.Fatalf("poplib output %q: %v", stdout, err)
	}
	want := map[string]any{
		"welcome":         "+OK pop.test Quill POP3 server ready",
		"capa_before_tls": []any{"AUTH-RESP-CODE", "EXPIRE", "IMPLEMENTATION", "PIPELINING", "RESP-CODES", "STLS", "TOP", "UIDL"},
		"capa":            []any{"AUTH-RESP-CODE", "EXPIRE", "IMPLEMENTATION", "PIPELINING", "RESP-CODES", "SASL", "TOP", "UIDL", "USER"},
		"stat":            []any{3.0, 198.0},
		"list":            []any{"1 89", "2 51", "3 58"},
		"uidl":            []any{"1 uid-1", "2 uid-2", "3 uid-3"},
		"uidl_2":          "+OK 2 uid-2",
		// poplib undoes the byte-stuffing; its octet count includes the
		// CRLFs it strips.
		"retr_2":        []any{"Subject: dots", "", ".leading dot", "..two dots", ".", "end"},
		"retr_2_octets": 51.0,
		"top_3_1":       []any{"Subject: third", "", "line 1"},
		"dele_1":        "+OK message 1 deleted",
		"retr_deleted":  "b'-ERR message already deleted'",
		"quit":          "+OK pop.test signing off (1 messages deleted)",
		"auth":          "+OK maildrop has 2 messages (109 octets)",
		"uidl_after":    []any{"1 uid-2", "2 uid-3"},
	}
	if !reflect.DeepEqual(got, want) {
		gotJSON, _ := json.MarshalIndent(got, "", " ")
		t.Errorf("poplib saw:\n%s", gotJSON)
		for k, w := range want {
			if !reflect.DeepEqual(got[k], w) {
				t.Errorf("%s = %#v, want %#v", k, got[k], w)
			}
		}
	}
}
