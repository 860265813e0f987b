package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "quill.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	c, err := Load(write(t, `
hostname = "mx.example.test"
domains = ["Example.test", "example.org."]
[listeners]
smtp = "127.0.0.1:25"
imap = "off"
[limits]
command_timeout = "90s"
preauth_timeout = "20s"
tls_handshake_timeout = "10s"
min_transfer_rate = 4096
transfer_grace = "1m"
body_memory_budget = 33554432
[log]
flush_interval = "0"
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Hostname != "mx.example.test" || c.Listeners.SMTP != "127.0.0.1:25" || c.Limits.CommandTimeout.Duration != 90*time.Second {
		t.Fatalf("loaded %+v", c)
	}
	if l := c.Limits; l.PreauthTimeout.Duration != 20*time.Second || l.TLSHandshakeTimeout.Duration != 10*time.Second ||
		l.MinTransferRate != 4096 || l.TransferGrace.Duration != time.Minute || l.BodyMemoryBudget != 32<<20 {
		t.Fatalf("limits loaded %+v", l)
	}
	if c.Domains[0] != "example.test" || c.Domains[1] != "example.org" {
		t.Fatalf("domains not normalized: %v", c.Domains)
	}
	if c.Log.FlushInterval.Duration != 0 || Default().Log.FlushInterval.Duration == 0 {
		t.Fatalf("log.flush_interval = %v, want 0 (default %v)", c.Log.FlushInterval, Default().Log.FlushInterval)
	}
	if c.Listeners.POP3 != Default().Listeners.POP3 {
		t.Fatal("unset key did not keep its default")
	}
}

func TestLoadRejectsUnknownKeys(t *testing.T) {
	_, err := Load(write(t, "[limits]\nmax_mesage_bytes = 10\n"))
	if err == nil || !strings.Contains(err.Error(), "max_mesage_bytes") {
		t.Fatalf("typo accepted: %v", err)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := Default()
	c.Domains = []string{"not a domain"}
	c.Listeners.SMTP = "nonsense"
	c.TLS.CertFile = "cert.pem"
	c.Limits.MaxRecipients = 0
	c.Store.Engine = "mongodb"
	c.Log.FlushInterval.Duration = -time.Second
	c.Limits.MinTransferRate = 0
	c.Limits.BodyMemoryBudget = 1000
	c.Limits.PreauthTimeout.Duration = 0
	c.Limits.TLSHandshakeTimeout.Duration = 0
	c.Limits.TransferGrace.Duration = 0
	c.Auth.TrustedNetworks = []string{"10.0.0.0/8", "10.0.0.0/33"}
	c.ProxyProtocol.Listeners = []string{"imap", "admin"}
	err := c.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"domain", "listeners.smtp", "key_file", "max_recipients", "store.engine", "log.flush_interval",
		"min_transfer_rate", "body_memory_budget", "preauth_timeout", "tls_handshake_timeout", "transfer_grace",
		"auth.trusted_networks", "proxy_protocol.listeners", "proxy_protocol.trusted_proxies"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes([]string{"10.1.2.3/8", "192.0.2.1", "2001:db8::/48", "::ffff:192.0.2.9"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.0.2.1/32", "2001:db8::/48", "192.0.2.9/32"}
	for i, p := range got {
		if p.String() != want[i] {
			t.Errorf("prefix %d = %s, want %s", i, p, want[i])
		}
	}
	for _, bad := range []string{"", "10.0.0.0/", "example.test", "2001:db8::/129"} {
		if _, err := ParsePrefixes([]string{bad}); err == nil {
			t.Errorf("ParsePrefixes(%q) accepted", bad)
		}
	}
}

func TestValidateMaildropLease(t *testing.T) {
	for _, d := range []time.Duration{0, 2 * time.Second, 4500 * time.Millisecond} {
		c := Default()
		c.Store.Engine = "cassandra"
		c.Store.Cassandra.MaildropLease.Duration = d
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "maildrop_lease") {
			t.Errorf("maildrop_lease %v: %v, want an error naming it", d, err)
		}
	}
	c := Default()
	c.Store.Engine = "cassandra"
	if err := c.Validate(); err != nil {
		t.Errorf("default cassandra config: %v", err)
	}
}

func TestValidateConnectionsPerHost(t *testing.T) {
	for n, ok := range map[int]bool{-1: false, 0: true, 1: true, 16: true, 17: false} {
		c := Default()
		c.Store.Engine = "cassandra"
		c.Store.Cassandra.ConnectionsPerHost = n
		if err := c.Validate(); (err == nil) != ok || (err != nil && !strings.Contains(err.Error(), "connections_per_host")) {
			t.Errorf("connections_per_host %d: %v", n, err)
		}
	}
}

func TestCluster(t *testing.T) {
	c, err := Load(write(t, `
[store]
engine = "cassandra"
[cluster]
addr = "10.0.0.1:7946"
join = ["10.0.0.2:7946", "node3.example.test:7946"]
detection_timeout = "3s"
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Cluster.Addr != "10.0.0.1:7946" || len(c.Cluster.Join) != 2 || c.Cluster.DetectionTimeout.Duration != 3*time.Second {
		t.Fatalf("cluster loaded %+v", c.Cluster)
	}
	if d := Default().Cluster; d.Addr != Off || d.DetectionTimeout.Duration != 2*time.Second {
		t.Fatalf("default cluster %+v", d)
	}
	if _, err := Load(write(t, "[cluster]\nseeds = []\n")); err == nil || !strings.Contains(err.Error(), "cluster.seeds") {
		t.Fatalf("unknown cluster key accepted: %v", err)
	}

	c = Default()
	c.Cluster = Cluster{Addr: "127.0.0.1:7946", Join: []string{"nohost", "127.0.0.1:0"}, AdvertiseAddr: ":7946",
		DetectionTimeout: Duration{100 * time.Millisecond}}
	err = c.Validate()
	for _, want := range []string{`store.engine = "cassandra"`, `cluster.join: "nohost"`, `cluster.join: "127.0.0.1:0"`,
		"cluster.advertise_addr", "cluster.detection_timeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want it to mention %s", err, want)
		}
	}
	c = Default()
	c.Cluster.Join = []string{"127.0.0.1:7946"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "cluster.join needs cluster.addr") {
		t.Fatalf("join without addr: %v", err)
	}
}
