// Package config is Quill's one typed configuration: defaults, the TOML
// file, validation. Command-line flags override file values (cmd/quill);
// Validate runs before anything starts. docs/configuration.md documents
// every option and must be kept in step with this file.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"quill/internal/mail"
)

// Off disables a listener.
const Off = "off"

// Config is the whole configuration.
type Config struct {
	// Hostname is this node's name in greetings and Received fields.
	Hostname string `toml:"hostname"`
	// Domains are the local mail domains; the first is the primary one.
	Domains []string `toml:"domains"`
	// DataDir holds the store, the generated TLS certificate and run files.
	DataDir string `toml:"data_dir"`

	Listeners Listeners `toml:"listeners"`
	TLS       TLS       `toml:"tls"`
	Limits    Limits    `toml:"limits"`
	Auth      Auth      `toml:"auth"`
	Delivery  Delivery  `toml:"delivery"`
	Store     Store     `toml:"store"`
	Cluster   Cluster   `toml:"cluster"`
	Log       Log       `toml:"log"`

	// ProxyProtocol: listeners behind a proxy that passes the client's address.
	ProxyProtocol ProxyProtocol `toml:"proxy_protocol"`
}

// Listeners are host:port addresses, or "off".
type Listeners struct {
	SMTP        string `toml:"smtp"`        // inbound MX (RFC 5321), STARTTLS offered
	Submission  string `toml:"submission"`  // RFC 6409, STARTTLS required before AUTH
	Submissions string `toml:"submissions"` // RFC 8314 implicit TLS
	LMTP        string `toml:"lmtp"`        // RFC 2033 over TCP; unauthenticated, keep it private
	LMTPSocket  string `toml:"lmtp_socket"` // RFC 2033 over a unix socket path ("" = none)
	POP3        string `toml:"pop3"`        // STLS offered
	POP3S       string `toml:"pop3s"`       // implicit TLS
	IMAP        string `toml:"imap"`        // RFC 9051 and 3501, STARTTLS offered
	IMAPS       string `toml:"imaps"`       // implicit TLS
	Admin       string `toml:"admin"`       // health, readiness, metrics, user administration
}

// TLS configures certificates. With neither file set, a self-signed
// certificate for Hostname is generated into DataDir/tls on first start.
type TLS struct {
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
}

// Limits bound what one client can make the server do.
type Limits struct {
	MaxMessageBytes     int64    `toml:"max_message_bytes"`
	MaxRecipients       int      `toml:"max_recipients"`
	MaxConnections      int      `toml:"max_connections"`
	MaxConnectionsPerIP int      `toml:"max_connections_per_ip"`
	MaxErrors           int      `toml:"max_errors"`
	CommandTimeout      Duration `toml:"command_timeout"`
	POP3IdleTimeout     Duration `toml:"pop3_idle_timeout"`
	ShutdownTimeout     Duration `toml:"shutdown_timeout"`
	// PreauthTimeout replaces the command and idle timeouts until a client
	// has authenticated (POP3, IMAP, submission) or said EHLO/HELO/LHLO
	// (SMTP, LMTP).
	PreauthTimeout Duration `toml:"preauth_timeout"`
	// TLSHandshakeTimeout bounds every TLS handshake: implicit TLS
	// listeners and STARTTLS/STLS alike.
	TLSHandshakeTimeout Duration `toml:"tls_handshake_timeout"`
	// MinTransferRate (octets per second) and TransferGrace bound how
	// slowly a message body (DATA, BDAT) or APPEND may arrive: the client
	// is allowed TransferGrace plus one second per MinTransferRate octets
	// of waiting, and is disconnected beyond that with nothing stored.
	MinTransferRate int64    `toml:"min_transfer_rate"`
	TransferGrace   Duration `toml:"transfer_grace"`
	// BodyMemoryBudget bounds the octets of message bodies in flight on
	// the node (received over SMTP, LMTP or IMAP APPEND and not yet
	// durable); a body that would exceed it waits, then gets a temporary
	// error. A body alone in flight is always accepted.
	BodyMemoryBudget int64 `toml:"body_memory_budget"`
	// OverloadLatency: while the Go scheduler's latency (p90 over each
	// quarter second) stays above it, the node is overloaded and refuses
	// new connections at once (internal/load). Zero turns that off.
	OverloadLatency Duration `toml:"overload_latency"`
}

// Auth configures authentication.
type Auth struct {
	// AllowInsecure permits plaintext passwords on unencrypted connections
	// from non-loopback peers. Loopback peers are always allowed.
	AllowInsecure bool `toml:"allow_insecure"`
	// MaxFailures failed logins within FailureWindow, from one IP or for
	// one user, make further attempts fail until the window passes.
	MaxFailures   int      `toml:"max_failures"`
	FailureWindow Duration `toml:"failure_window"`
	// TrustedNetworks (CIDRs, or single addresses) are exempt from the
	// per-address count of failures, never from the per-account one: a
	// webmail or proxy on them logs in many users from one address.
	TrustedNetworks []string `toml:"trusted_networks"`
	// KDFMemoryBudget (bytes) bounds the memory of the password checks
	// (argon2id) running at once, KDFConcurrency their number (0: one per
	// CPU). A check finding no room waits up to KDFWait, then the login
	// gets a temporary failure.
	KDFMemoryBudget int64    `toml:"kdf_memory_budget"`
	KDFConcurrency  int      `toml:"kdf_concurrency"`
	KDFWait         Duration `toml:"kdf_wait"`
	// CacheTTL is how long a verified login is remembered so that polling
	// clients do not pay for argon2id at every login; a negative value
	// disables the cache. A password change invalidates it at once.
	CacheTTL Duration `toml:"cache_ttl"`
}

// ProxyProtocol names the listeners that expect the HAProxy PROXY protocol
// (v1 or v2) header from every connection, and the proxies trusted to send
// it. On those listeners, connections from elsewhere are refused, and the
// client address in the header is the peer everywhere (connection limits,
// authentication throttle, logs, Received fields).
type ProxyProtocol struct {
	Listeners      []string `toml:"listeners"`       // e.g. ["imap", "submission"]
	TrustedProxies []string `toml:"trusted_proxies"` // CIDRs or addresses
	HeaderTimeout  Duration `toml:"header_timeout"`
}

// Delivery configures local delivery.
type Delivery struct {
	SubaddressSeparator string `toml:"subaddress_separator"`
	// DirectoryTTL is how long a node remembers a recipient's user record
	// (delivery.Options.DirectoryTTL). Zero is the engine's default: 5 s
	// on Cassandra, where each lookup is a read over the network, none on
	// the embedded engine, whose lookups are local and cached coherently.
	// A negative value turns it off.
	DirectoryTTL Duration `toml:"directory_ttl"`
}

// Store selects and tunes the storage engine.
type Store struct {
	Engine     string `toml:"engine"` // "embedded" or "cassandra"
	CacheBytes int64  `toml:"cache_bytes"`
	// ReserveBytes is the embedded engine's reserve for a full disk: space
	// kept allocated and released when the disk fills, so that deletions
	// still succeed (0: none).
	ReserveBytes int64     `toml:"reserve_bytes"`
	Cassandra    Cassandra `toml:"cassandra"`
}

// Cassandra configures engine = "cassandra" (docs/cassandra.md states what
// an acknowledgement guarantees under each setting).
type Cassandra struct {
	Hosts    []string `toml:"hosts"` // contact points, "host" or "host:port"
	Keyspace string   `toml:"keyspace"`
	// Replication applies when Quill creates the keyspace; an existing
	// keyspace keeps its own. Class is SimpleStrategy (with Factor) or
	// NetworkTopologyStrategy (with Datacenters: name -> factor).
	ReplicationClass  string         `toml:"replication_class"`
	ReplicationFactor int            `toml:"replication_factor"`
	Datacenters       map[string]int `toml:"datacenters"`
	// Consistency levels by their CQL names (ONE, QUORUM, LOCAL_QUORUM, ALL...).
	ReadConsistency   string   `toml:"read_consistency"`
	WriteConsistency  string   `toml:"write_consistency"`
	SerialConsistency string   `toml:"serial_consistency"` // SERIAL or LOCAL_SERIAL
	ConnectTimeout    Duration `toml:"connect_timeout"`
	Timeout           Duration `toml:"timeout"`
	// IdlePoll is how often an IMAP session in IDLE reads its mailbox's
	// change log for changes made through other nodes (those made through
	// this node wake it at once). Each poll is one read at read_consistency.
	IdlePoll Duration `toml:"idle_poll"`
	// MaildropLease is the term of a POP3 session's lease on its maildrop,
	// shared by every node: renewed every third of it (one LWT) while the
	// session lives, it keeps a dead node's maildrops locked this long.
	MaildropLease Duration `toml:"maildrop_lease"`
	// ConnectionsPerHost is the driver's connections to each Cassandra
	// host (cassandra.Options.ConnsPerHost; 0: the default, 1).
	ConnectionsPerHost int `toml:"connections_per_host"`
	// TLS to Cassandra: on when TLS is true; CAFile verifies the servers,
	// CertFile/KeyFile authenticate Quill to them.
	TLS        bool   `toml:"tls"`
	CAFile     string `toml:"ca_file"`
	CertFile   string `toml:"cert_file"`
	KeyFile    string `toml:"key_file"`
	ServerName string `toml:"server_name"`
	Username   string `toml:"username"`
	Password   string `toml:"password"`
}

// Cluster configures the node-to-node listener, membership and the seed
// list (docs/cluster.md). With Addr off the node runs alone.
type Cluster struct {
	// Addr is the node-to-node listener, TCP and UDP on one port
	// (host:port), or "off".
	Addr string `toml:"addr"`
	// AdvertiseAddr is the host:port other nodes reach this one at; ""
	// means Addr, which must then name a specific address.
	AdvertiseAddr string `toml:"advertise_addr"`
	// Join lists host:port of any live nodes; empty starts a new cluster.
	Join []string `toml:"join"`
	// DetectionTimeout bounds how long a dead node is listed alive
	// (membership's timers follow from it; docs/adr/0020).
	DetectionTimeout Duration `toml:"detection_timeout"`
	// LeaseTerm is the term of a node's lease on its buckets (docs/adr/0024,
	// 0027): a node renews it every third of the term, and a dead node's
	// buckets move about term + term/6 after its last renewal.
	LeaseTerm Duration `toml:"lease_term"`
	// ForwardTimeout bounds a mailbox write forwarded to the user's
	// manager, retries included; past it the write fails temporarily.
	ForwardTimeout Duration `toml:"forward_timeout"`
}

// Log configures logging to standard error.
type Log struct {
	Level  string `toml:"level"`  // debug, info, warn, error
	Format string `toml:"format"` // text, json
	// FlushInterval batches records below Warn into one write per
	// interval (or per 64 KiB); warnings and errors are written at once.
	// 0 writes every record as it is made.
	FlushInterval Duration `toml:"flush_interval"`
}

// Duration is a time.Duration written as "5m" in TOML.
type Duration struct{ time.Duration }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Default returns the configuration used when nothing is set. Ports are
// unprivileged (the usual port plus 2000, or 2424 for LMTP, which has no well-known port) so that a
// development server needs no root; LMTP and admin listen on loopback only
// because neither authenticates its clients.
func Default() Config {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return Config{
		Hostname: host,
		Domains:  []string{"localhost"},
		DataDir:  "./quill-data",
		Listeners: Listeners{
			SMTP:        ":2525",
			Submission:  ":2587",
			Submissions: ":2465",
			LMTP:        "127.0.0.1:2424",
			POP3:        ":1110",
			POP3S:       ":1995",
			IMAP:        ":1143",
			IMAPS:       ":1993",
			Admin:       "127.0.0.1:8080",
		},
		Limits: Limits{
			// Twice the 25 MiB most providers accept, so mail from them
			// always fits, base64 overhead included.
			MaxMessageBytes: 50 << 20,
			MaxRecipients:   100, // RFC 5321 4.5.3.1.8: at least 100
			// Well under the file-descriptor limits of a default system,
			// and far above what one 2-core node serves well.
			MaxConnections: 5000,
			// Enough for a large NAT or a busy MTA in front; low enough that
			// one host cannot take a large share of MaxConnections.
			MaxConnectionsPerIP: 100,
			// Failed commands before the connection is closed: generous
			// for a confused client, short for a dictionary attack.
			MaxErrors:       10,
			CommandTimeout:  Duration{5 * time.Minute},  // RFC 5321 4.5.3.2
			POP3IdleTimeout: Duration{10 * time.Minute}, // RFC 1939 section 3
			// The RFC minimums above protect sessions that have something
			// to lose; a client that has not logged in (or said EHLO) has
			// not, and a real one needs seconds.
			PreauthTimeout: Duration{time.Minute},
			// A real TLS handshake takes well under a second, even on a
			// slow link; 30 s is what IMAP and POP3 always allowed.
			TLSHandshakeTimeout: Duration{30 * time.Second},
			// 1 KiB/s is 8 kbit/s, below any link still in use; the 30 s
			// grace covers TCP slow start and a client that composes the
			// body as it sends it. Time the server spends storing is not
			// charged to the client.
			MinTransferRate: 1 << 10,
			TransferGrace:   Duration{30 * time.Second},
			// Sized for a small node (2 cores, a few GiB): one maximal
			// message beside others, or hundreds of typical ones at once;
			// docs/configuration.md has what it bounds in practice.
			BodyMemoryBudget: 64 << 20,
			// One wait to run in ten over half a second, sustained:
			// replies take seconds (load.DefaultThreshold).
			OverloadLatency: Duration{500 * time.Millisecond},
			// Long enough for a transaction in progress to finish; short
			// enough for a service manager's stop timeout (90 s in systemd).
			ShutdownTimeout: Duration{30 * time.Second},
		},
		Auth: Auth{
			// 10 failures in 5 minutes stops online guessing (at most ~3,000
			// guesses a day per IP or user) without locking out a user who
			// mistyped a few times.
			MaxFailures:   10,
			FailureWindow: Duration{5 * time.Minute},
			// Shorter than typical POP3/IMAP polling intervals would be
			// pointless; 5 minutes covers them.
			CacheTTL: Duration{5 * time.Minute},
			// 256 MiB holds 13 checks at the default 19 MiB, more than a
			// small node has cores, and is a small share of its memory.
			KDFMemoryBudget: 256 << 20,
			// 5 s: the first logins of a few hundred clients connecting at
			// once (about 50 ms a check, two cores) are still served, while
			// a flood is refused within seconds instead of piling up.
			KDFWait: Duration{5 * time.Second},
		},
		// A proxy sends the header with its first bytes; 5 s allows a slow
		// network and frees a stalled connection quickly.
		ProxyProtocol: ProxyProtocol{HeaderTimeout: Duration{5 * time.Second}},
		// "+" is the subaddress separator most users know (RFC 5233).
		Delivery: Delivery{SubaddressSeparator: "+"},
		// Bodies share the block cache with metadata; below about 256 MiB,
		// retrieved bodies evict the index and metadata blocks every
		// delivery reads (docs/adr/0019-performance-record.md measures 64 vs 256 MiB).
		// The reserve: room for the flush of two default memtables (32 MiB
		// each) and the expunges of a while once the disk is full.
		Store: Store{Engine: "embedded", CacheBytes: 256 << 20, ReserveBytes: 128 << 20, Cassandra: Cassandra{
			Hosts: []string{"127.0.0.1:9042"}, Keyspace: "quill",
			ReplicationClass: "SimpleStrategy", ReplicationFactor: 3,
			// LOCAL_QUORUM both ways: reads overlap acknowledged writes
			// (UID order, no lost mail) and one replica of three may be down.
			ReadConsistency: "LOCAL_QUORUM", WriteConsistency: "LOCAL_QUORUM", SerialConsistency: "LOCAL_SERIAL",
			// Above Cassandra's own 5 s request timeouts, so that its
			// answer, not ours, decides.
			ConnectTimeout: Duration{10 * time.Second}, Timeout: Duration{12 * time.Second},
			// 5 s: prompt enough for a mail client, and 1,000 idling
			// sessions cost 200 reads/s (docs/cassandra.md has the table).
			IdlePoll: Duration{5 * time.Second},
			// 30 s: a user whose POP3 node died waits at most this long to
			// log in elsewhere, and a session renews every 10 s (one LWT).
			MaildropLease: Duration{30 * time.Second},
		}},
		// A single node unless asked; 2 s is the bound on
		// detecting a dead node, met with room (docs/adr/0020).
		Cluster: Cluster{Addr: Off, DetectionTimeout: Duration{2 * time.Second}, LeaseTerm: Duration{3 * time.Second},
			ForwardTimeout: Duration{5 * time.Second}},
		Log: Log{Level: "info", Format: "text", FlushInterval: Duration{100 * time.Millisecond}},
	}
}

// Load returns Default overlaid with the TOML file at path. Unknown keys
// are errors, so a typo never silently falls back to a default.
func Load(path string) (Config, error) {
	c := Default()
	md, err := toml.DecodeFile(path, &c)
	if err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		keys := make([]string, len(un))
		for i, k := range un {
			keys[i] = k.String()
		}
		return c, fmt.Errorf("config %s: unknown keys: %s", path, strings.Join(keys, ", "))
	}
	return c, nil
}

// Validate checks the whole configuration and returns every problem found.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Hostname == "" {
		bad("hostname is empty")
	}
	if len(c.Domains) == 0 {
		bad("at least one domain is required")
	}
	for i, d := range c.Domains {
		a, err := mail.ParseAddress("postmaster@"+d, true)
		if err != nil || strings.HasPrefix(a.Domain, "[") {
			bad("domain %q is not a domain name", d)
		}
		c.Domains[i] = strings.ToLower(strings.TrimSuffix(d, "."))
	}
	if c.DataDir == "" {
		bad("data_dir is empty")
	}
	l := c.Listeners
	for _, x := range []struct{ name, addr string }{
		{"smtp", l.SMTP}, {"submission", l.Submission}, {"submissions", l.Submissions}, {"lmtp", l.LMTP},
		{"pop3", l.POP3}, {"pop3s", l.POP3S}, {"imap", l.IMAP}, {"imaps", l.IMAPS}, {"admin", l.Admin},
	} {
		if err := checkAddr(x.addr); err != nil {
			bad("listeners.%s: %v", x.name, err)
		}
	}
	if l.LMTPSocket != "" && !strings.HasPrefix(l.LMTPSocket, "/") {
		bad("listeners.lmtp_socket must be an absolute path")
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("tls.cert_file and tls.key_file must be set together")
	}
	lim := c.Limits
	if lim.MaxMessageBytes < 1024 {
		bad("limits.max_message_bytes must be at least 1024")
	}
	if lim.MaxRecipients < 1 {
		bad("limits.max_recipients must be positive")
	}
	if lim.MaxConnections < 1 || lim.MaxConnectionsPerIP < 1 {
		bad("limits.max_connections and max_connections_per_ip must be positive")
	}
	if lim.MaxErrors < 1 {
		bad("limits.max_errors must be positive")
	}
	if lim.MinTransferRate < 1 {
		bad("limits.min_transfer_rate must be positive")
	}
	if lim.BodyMemoryBudget < 1<<20 {
		bad("limits.body_memory_budget must be at least 1 MiB")
	}
	if lim.OverloadLatency.Duration < 0 {
		bad("limits.overload_latency must not be negative (0 turns shedding off)")
	}
	for _, d := range []struct {
		name string
		d    Duration
	}{
		{"limits.command_timeout", lim.CommandTimeout}, {"limits.pop3_idle_timeout", lim.POP3IdleTimeout},
		{"limits.shutdown_timeout", lim.ShutdownTimeout}, {"auth.failure_window", c.Auth.FailureWindow},
		{"limits.preauth_timeout", lim.PreauthTimeout}, {"limits.tls_handshake_timeout", lim.TLSHandshakeTimeout},
		{"limits.transfer_grace", lim.TransferGrace},
	} {
		if d.d.Duration <= 0 {
			bad("%s must be positive", d.name)
		}
	}
	if c.Auth.MaxFailures < 1 {
		bad("auth.max_failures must be positive")
	}
	if c.Auth.KDFMemoryBudget < 19<<20 {
		bad("auth.kdf_memory_budget must be at least 19 MiB (one check at the default cost)")
	}
	if c.Auth.KDFConcurrency < 0 {
		bad("auth.kdf_concurrency must not be negative")
	}
	if c.Auth.KDFWait.Duration <= 0 {
		bad("auth.kdf_wait must be positive")
	}
	if _, err := ParsePrefixes(c.Auth.TrustedNetworks); err != nil {
		bad("auth.trusted_networks: %v", err)
	}
	validateProxyProtocol(c.ProxyProtocol, bad)
	switch c.Store.Engine {
	case "embedded":
	case "cassandra":
		validateCassandra(c.Store.Cassandra, bad)
	default:
		bad("store.engine %q is not known (embedded, cassandra)", c.Store.Engine)
	}
	if c.Store.CacheBytes < 1<<20 {
		bad("store.cache_bytes must be at least 1 MiB")
	}
	if c.Store.ReserveBytes < 0 {
		bad("store.reserve_bytes must not be negative")
	}
	validateCluster(c, bad)
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level %q is not debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		bad("log.format %q is not text or json", c.Log.Format)
	}
	if c.Log.FlushInterval.Duration < 0 {
		bad("log.flush_interval must not be negative")
	}
	return errors.Join(errs...)
}

// ParsePrefixes parses CIDR prefixes; a bare address is its own /32 or
// /128.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		if a, err := netip.ParseAddr(s); err == nil {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not an address or CIDR prefix", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Enabled reports whether a listener address is on.
func Enabled(addr string) bool { return addr != "" && addr != Off }

func checkAddr(addr string) error {
	if !Enabled(addr) {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port or %q", addr, Off)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q has a bad port", addr)
	}
	return nil
}

// validateProxyProtocol checks the [proxy_protocol] section.
func validateProxyProtocol(p ProxyProtocol, bad func(string, ...any)) {
	for _, name := range p.Listeners {
		switch name {
		case "smtp", "submission", "submissions", "lmtp", "pop3", "pop3s", "imap", "imaps":
		default:
			bad("proxy_protocol.listeners: %q is not a TCP mail listener", name)
		}
	}
	trusted, err := ParsePrefixes(p.TrustedProxies)
	if err != nil {
		bad("proxy_protocol.trusted_proxies: %v", err)
	} else if len(p.Listeners) > 0 && len(trusted) == 0 {
		bad("proxy_protocol.trusted_proxies must name the proxies when proxy_protocol.listeners is set")
	}
	if p.HeaderTimeout.Duration <= 0 {
		bad("proxy_protocol.header_timeout must be positive")
	}
}

// validateCassandra checks the [store.cassandra] section.
func validateCassandra(c Cassandra, bad func(string, ...any)) {
	if len(c.Hosts) == 0 {
		bad("store.cassandra.hosts must name at least one contact point")
	}
	if c.IdlePoll.Duration < 100*time.Millisecond {
		bad("store.cassandra.idle_poll must be at least 100ms")
	}
	if c.ConnectionsPerHost < 0 || c.ConnectionsPerHost > 16 {
		bad("store.cassandra.connections_per_host must be 0 (the default, 1) to 16")
	}
	if c.MaildropLease.Duration < 3*time.Second || c.MaildropLease.Duration%time.Second != 0 {
		bad("store.cassandra.maildrop_lease must be whole seconds, at least 3s (a CQL TTL, renewed every third)")
	}
	if c.Keyspace == "" || len(c.Keyspace) > 48 || strings.Trim(c.Keyspace, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		bad("store.cassandra.keyspace %q must be 1-48 of [a-z0-9_]", c.Keyspace)
	}
	switch c.ReplicationClass {
	case "SimpleStrategy":
		if c.ReplicationFactor < 1 {
			bad("store.cassandra.replication_factor must be positive")
		}
	case "NetworkTopologyStrategy":
		if len(c.Datacenters) == 0 {
			bad("store.cassandra.datacenters must give a factor per datacenter")
		}
		for dc, f := range c.Datacenters {
			if f < 1 {
				bad("store.cassandra.datacenters.%s must be positive", dc)
			}
		}
	default:
		bad("store.cassandra.replication_class %q is not SimpleStrategy or NetworkTopologyStrategy", c.ReplicationClass)
	}
	for name, v := range map[string]string{"read_consistency": c.ReadConsistency, "write_consistency": c.WriteConsistency} {
		switch v {
		case "ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE":
		default:
			bad("store.cassandra.%s %q is not a consistency level", name, v)
		}
	}
	if c.SerialConsistency != "SERIAL" && c.SerialConsistency != "LOCAL_SERIAL" {
		bad("store.cassandra.serial_consistency %q is not SERIAL or LOCAL_SERIAL", c.SerialConsistency)
	}
	if c.ConnectTimeout.Duration <= 0 || c.Timeout.Duration <= 0 {
		bad("store.cassandra.connect_timeout and timeout must be positive")
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		bad("store.cassandra.cert_file and key_file go together")
	}
	if !c.TLS && (c.CAFile != "" || c.CertFile != "") {
		bad("store.cassandra.ca_file/cert_file need tls = true")
	}
}

// validateCluster checks the [cluster] section.
func validateCluster(c *Config, bad func(string, ...any)) {
	cl := c.Cluster
	if err := checkAddr(cl.Addr); err != nil {
		bad("cluster.addr: %v", err)
	}
	if cl.DetectionTimeout.Duration < 500*time.Millisecond || cl.DetectionTimeout.Duration > time.Minute {
		bad("cluster.detection_timeout must be between 500ms and 1m")
	}
	if cl.LeaseTerm.Duration < 600*time.Millisecond || cl.LeaseTerm.Duration > time.Minute {
		bad("cluster.lease_term must be between 600ms and 1m")
	}
	if cl.ForwardTimeout.Duration < 100*time.Millisecond || cl.ForwardTimeout.Duration > time.Minute {
		bad("cluster.forward_timeout must be between 100ms and 1m")
	}
	for _, a := range cl.Join {
		if err := checkPeer(a); err != nil {
			bad("cluster.join: %v", err)
		}
	}
	if cl.AdvertiseAddr != "" {
		if err := checkPeer(cl.AdvertiseAddr); err != nil {
			bad("cluster.advertise_addr: %v", err)
		}
	}
	if !Enabled(cl.Addr) {
		if len(cl.Join) > 0 {
			bad("cluster.join needs cluster.addr (--cluster-addr)")
		}
		return
	}
	if c.Store.Engine != "cassandra" {
		bad("cluster.addr needs store.engine = \"cassandra\": the embedded store admits one process, so nodes cannot share it")
	}
}

// checkPeer checks a host:port another node is reached at: a port other
// than 0 is required.
func checkPeer(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q has a bad port", addr)
	}
	return nil
}
