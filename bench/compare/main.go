// Command compare is the Porcupine workload benchmark of Quill side by side
// with Postfix + Dovecot at equal durability, with quill-sink (Quill's SMTP
// front end storing nothing) as the protocol-bound upper limit, and with
// quill-sink --durable (the same front end appending each message to one
// file, fdatasync before the reply, group commit) as the durability floor:
// the cheapest durable SMTP server on this machine, and with quill-sink
// --durable --pop3-addr as the mail floor: that log plus an index in
// memory, served over Quill's POP3 front end, the cheapest server that does
// all the mix asks at the same durability; with --no-sync as well it is the
// volatile floor, the mail floor without its fdatasyncs: the mix with
// durability left out. One invocation, as root on Debian:
//
//	go run ./bench/compare [--users 10000 --clients 16 --duration 20s --rounds 2] [--retrieval imap]
//
// Fair by default: every target runs both with one message per SMTP
// connection (connect, EHLO, MAIL, RCPT, DATA, QUIT, as Porcupine and
// postal do) and with persistent connections, in the same round, and the
// report leads with the former (--conns); neither Quill nor Dovecot caches
// verified logins (--auth-cache); Quill serves IMAP as Dovecot does; and a
// run during which other processes took more than --max-other of the
// machine is marked disturbed and left out of the medians.
//
// It installs the Debian packages it lacks (postfix, dovecot-core,
// dovecot-pop3d, dovecot-lmtpd, dovecot-imapd), builds quill and
// quill-sink from the tree, provisions the same users with the same
// argon2id password hash on both servers, runs the same mix against each in
// turn (Quill, peer, sink, durable sink, mail floor, volatile floor, Quill,
// peer, ...), and prints each figure's median with the Quill/peer ratio and
// the rates as shares of one another (report.go). With --saturate each run
// is instead a saturation search (loadgen.Saturate: open loop at rising
// rates until the SMTP latency bound breaks, then narrowed), and each
// target's column is its run at the highest rate that passed. With --warmup each target that
// stores mail first runs the mix for that long, unmeasured, so that the
// rounds see it in steady state. Everything binds loopback ports
// chosen at run time, lives under one temporary directory, and is stopped
// on the way out, failure or not. See docs/benchmark-harness.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"quill/internal/auth"
	"quill/internal/loadgen"
	"quill/internal/server"
	"quill/internal/store"
	"quill/internal/store/embedded"
)

const domain = "bench.test"

// password is every benchmark user's; it never leaves the machine.
const password = "bench-password-quill"

type options struct {
	users, clients, rounds, probes, sample int
	duration, budget, warmup               time.Duration
	zipf, pop3Share, rate                  float64
	sizes, out, retrieval                  string
	skipInstall, keep                      bool
	only, baseline                         string
	kdf                                    string
	cpuprofile                             string
	// The saturation search (--saturate): each run is a
	// loadgen.Saturate, and the comparison takes each target's peak.
	saturate         bool
	step, bound      time.Duration
	startRate        float64
	factor, maxShare float64
	refine, retries  int
	disturbed        int
	// Fairness (see the package comment).
	conns     string
	modes     []connMode
	authCache string
	maxOther  float64
}

// connMode is how the generator uses SMTP connections in a run.
type connMode struct {
	name    string // "one" or "persistent"
	perConn int    // loadgen.MixConfig.MessagesPerConn
	heading string
}

var connModes = []connMode{
	{"one", 1, "one message per SMTP connection (connect, EHLO, MAIL, RCPT, DATA, QUIT: as Porcupine and postal)"},
	{"persistent", 0, "persistent SMTP connections (each client keeps its connection for the whole run)"},
}

// parseConns parses --conns: connection modes, comma-separated, in order.
func parseConns(v string) ([]connMode, error) {
	var out []connMode
	for _, name := range strings.Split(v, ",") {
		i := slices.IndexFunc(connModes, func(m connMode) bool { return m.name == name })
		if i < 0 || slices.ContainsFunc(out, func(m connMode) bool { return m.name == name }) {
			return nil, fmt.Errorf("--conns %q: want one or persistent, comma-separated, each once", v)
		}
		out = append(out, connModes[i])
	}
	return out, nil
}

// saturateClients is the default bound on transactions in flight in a
// saturation search: enough that no server's peak on this class of machine
// is limited by the generator rather than by the latency bound.
const saturateClients = 256

func main() {
	var o options
	flag.IntVar(&o.users, "users", 10000, "population (Zipf ranks)")
	flag.IntVar(&o.clients, "clients", 16, fmt.Sprintf("concurrent clients (open loop: the most in flight; --saturate: %d unless set)", saturateClients))
	flag.IntVar(&o.rounds, "rounds", 2, "rounds; each runs every target once (A B A B)")
	flag.IntVar(&o.probes, "probes", 2, "end-to-end probe mailboxes")
	flag.IntVar(&o.sample, "sample", 16, "mailboxes sampled for the delivered rate")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "load phase of each run")
	flag.DurationVar(&o.budget, "budget", 30*time.Minute, "bound on the whole benchmark")
	flag.DurationVar(&o.warmup, "warmup", 0, "before the measured rounds, run the mix this long against each target that stores mail, "+
		"in closed loop with --clients, and discard it: a store's cost grows as it fills until retrieval keeps pace with delivery")
	flag.Float64Var(&o.zipf, "zipf", 1, "Zipf exponent")
	flag.Float64Var(&o.pop3Share, "pop3-share", 0.1, "share of transactions that are retrieval sessions")
	flag.StringVar(&o.retrieval, "retrieval", loadgen.RetrievalPOP3, "protocol of the retrieval sessions, probes and drain: pop3 or imap")
	flag.Float64Var(&o.rate, "rate", 0, "open loop offered tx/s (0: closed loop)")
	flag.StringVar(&o.sizes, "sizes", "lognormal", "size distribution (see quill-load mix -h)")
	flag.StringVar(&o.out, "out", "", "write every run's summary as JSON to this file")
	flag.BoolVar(&o.skipInstall, "skip-install", false, "do not apt-get install missing packages")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (logs, data)")
	flag.StringVar(&o.baseline, "baseline", "", "also run Quill built from this git `revision` of the working tree's repository, as target baseline, "+
		"in every round beside quill (A B A B), for a non-regression ratio")
	flag.StringVar(&o.only, "only", "", "run and start only these `targets`, comma-separated: quill, peer, sink, durable-sink, mail-floor, volatile-floor")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of quill's first run to this file (taken through its admin endpoint)")
	flag.StringVar(&o.kdf, "kdf", "default", "argon2id cost of the users' password hash, the same on both servers: "+
		"default (Quill's production parameters) or light (64 KiB, 1 pass: isolates the mail path from login cost)")
	flag.BoolVar(&o.saturate, "saturate", false, "run a saturation search (open loop, rising rates) per target and compare the peaks: "+
		"the highest offered rate at which no more than --max-share of the SMTP transactions failed, never started or took longer than --latency-bound")
	flag.DurationVar(&o.step, "step", 8*time.Second, "with --saturate: the length of one offered rate")
	flag.DurationVar(&o.bound, "latency-bound", 100*time.Millisecond, "with --saturate: the SMTP transaction latency bound")
	flag.Float64Var(&o.maxShare, "max-share", 0.05, "with --saturate: the tolerated share of SMTP transactions over the bound")
	flag.Float64Var(&o.startRate, "start-rate", 25, "with --saturate: the first offered rate, tx/s")
	flag.Float64Var(&o.factor, "factor", 4, "with --saturate: the rate multiplier of the climb")
	flag.IntVar(&o.refine, "refine", 5, "with --saturate: narrowing steps after the first failure (5 narrow a factor of 4 to 4.4%)")
	flag.IntVar(&o.retries, "retries", 1, "with --saturate: times a failing step of the climb is run again before it ends the climb "+
		"(the peer spawns its processes during the first steps)")
	flag.IntVar(&o.disturbed, "disturbed", 3, "with --saturate: times in a search that a failing step is run again, besides --retries, "+
		"because the disk probe saw an fdatasync longer than --latency-bound during it, for the targets that sync (0: never)")
	flag.StringVar(&o.conns, "conns", "one,persistent", "SMTP connection modes, comma-separated, each run in every round: "+
		"one (one message per connection, as Porcupine and postal) and persistent (a connection per client for the run); the report leads with the first")
	flag.StringVar(&o.authCache, "auth-cache", "off", "credential cache of both servers: off (neither Quill nor Dovecot remembers a verified login) "+
		"or a lifetime such as 5m (Quill's login cache and Dovecot's auth_cache, both for that long; Dovecot's cache keeps the hash and still runs the KDF at every login)")
	flag.Float64Var(&o.maxOther, "max-other", 0.10, "mark a run disturbed, and leave it out of the medians, when processes other than the servers under test and the harness "+
		"used more than this share of the machine's CPU during its load (from /proc/stat)")
	flag.Parse()
	if o.saturate {
		clientsSet := false
		flag.Visit(func(f *flag.Flag) { clientsSet = clientsSet || f.Name == "clients" })
		if !clientsSet {
			o.clients = saturateClients
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, o.budget)
	err := run(ctx, o)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "compare: %v\n", err)
		os.Exit(1)
	}
}

// debianPackages are what the peer needs.
var debianPackages = []string{"postfix", "dovecot-core", "dovecot-pop3d", "dovecot-lmtpd", "dovecot-imapd"}

func install(ctx context.Context) error {
	missing := false
	for _, f := range []string{"/usr/sbin/postfix", "/usr/sbin/dovecot", "/usr/lib/dovecot/lmtp", "/usr/lib/dovecot/pop3", "/usr/lib/dovecot/imap"} {
		if _, err := os.Stat(f); err != nil {
			missing = true
		}
	}
	if !missing {
		return nil
	}
	fmt.Fprintln(os.Stderr, "compare: installing", debianPackages)
	env := []string{"DEBIAN_FRONTEND=noninteractive"}
	if _, err := runCmd(ctx, env, "apt-get", "update"); err != nil {
		return err
	}
	_, err := runCmd(ctx, env, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, debianPackages...)...)
	return err
}

func run(ctx context.Context, o options) (err error) {
	if o.retrieval != loadgen.RetrievalPOP3 && o.retrieval != loadgen.RetrievalIMAP {
		return fmt.Errorf("--retrieval %q: want pop3 or imap", o.retrieval)
	}
	if o.saturate && (o.rate != 0 || o.cpuprofile != "") {
		return errors.New("--saturate chooses the rates itself and profiles nothing: drop --rate and --cpuprofile")
	}
	if o.modes, err = parseConns(o.conns); err != nil {
		return err
	}
	authTTL, err := parseAuthCache(o.authCache)
	if err != nil {
		return err
	}
	// wanted reports whether target name runs. The mail floors serve POP3
	// only, so an IMAP mix leaves them out.
	wanted := func(name string) bool {
		if (name == "mail-floor" || name == "volatile-floor") && o.retrieval != loadgen.RetrievalPOP3 {
			return false
		}
		if name == "baseline" {
			return o.baseline != ""
		}
		return o.only == "" || slices.Contains(strings.Split(o.only, ","), name)
	}
	if o.only != "" {
		for _, name := range strings.Split(o.only, ",") {
			if !slices.ContainsFunc(columns, func(c column) bool { return c.target == name }) {
				return fmt.Errorf("--only: no target %q", name)
			}
		}
	}
	if wanted("peer") { // Quill and the sinks need neither root nor packages
		if os.Geteuid() != 0 {
			return errors.New("run as root: Postfix's master starts as root and Dovecot delivers as the mail user")
		}
		if !o.skipInstall {
			if err := install(ctx); err != nil {
				return err
			}
		}
	}
	root, err := os.MkdirTemp("", "quill-bench-")
	if err != nil {
		return err
	}
	// Postfix and Dovecot daemons run unprivileged and must reach their
	// directories under root.
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	defer func() {
		if o.keep || err != nil {
			fmt.Fprintf(os.Stderr, "compare: logs and data kept in %s\n", root)
			return
		}
		os.RemoveAll(root)
	}()

	bin := filepath.Join(root, "bin")
	for _, cmd := range []string{"quill", "quill-sink"} {
		if _, err := runCmd(ctx, nil, "go", "build", "-o", filepath.Join(bin, cmd), "quill/cmd/"+cmd); err != nil {
			return err
		}
	}

	users := loadgen.UserNames(domain, o.users)
	probes := make([]string, o.probes)
	for i := range probes {
		probes[i] = fmt.Sprintf("probe%02d@%s", i, domain)
	}
	all := append(append([]string(nil), users...), probes...)
	kdf := auth.DefaultKDF
	switch o.kdf {
	case "default":
	case "light":
		kdf = auth.KDFParams{MemoryKiB: 64, Time: 1, Threads: 1}
	default:
		return fmt.Errorf("--kdf %q: want default or light", o.kdf)
	}
	hash, err := auth.HashPassword(password, kdf)
	if err != nil {
		return err
	}

	sizes, err := loadgen.ParseSizeDist(o.sizes)
	if err != nil {
		return err
	}
	z, err := loadgen.NewZipf(users, o.zipf)
	if err != nil {
		return err
	}
	base := loadgen.MixConfig{
		Spec:         loadgen.Spec{From: "loadgen@quill-load.invalid", Sizes: sizes, Rcpts: z},
		Password:     password,
		Retrieval:    o.retrieval,
		Mix:          loadgen.Mix{POP3PerMille: uint64(o.pop3Share*1000 + 0.5)},
		Clients:      o.clients,
		Rate:         o.rate,
		Duration:     o.duration,
		Probes:       probes,
		Sample:       loadgen.SampleMailboxes(users, o.sample),
		DrainTimeout: 2 * time.Minute,
		Timeout:      time.Minute,
	}

	// The targets, in the order of the runs (that of columns); each is
	// started only if it runs.
	var targets []target
	var qaddrs map[string]string
	var stops []func()
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	qdata := filepath.Join(root, "quill-data")
	// startQuill provisions a store and starts a Quill built from bin as
	// target name.
	startQuill := func(name, bin, data string) (map[string]string, error) {
		// Users loaded into the store before it starts.
		t0 := time.Now()
		if err := provisionQuill(ctx, data, all, hash); err != nil {
			return nil, fmt.Errorf("provisioning %s: %w", name, err)
		}
		fmt.Fprintf(os.Stderr, "compare: provisioned %d users in %s's store in %v\n", len(all), name, time.Since(t0).Round(time.Millisecond))
		// IMAP is served whatever the mix retrieves with, as Dovecot
		// serves it: with IMAP on, Quill stores a summary of every
		// message it delivers, and the peer's work includes its own.
		imapAddr := "127.0.0.1:0"
		// All the load comes from 127.0.0.1: the per-address connection
		// limit (100 by default) must not bind before the machine does,
		// as the peer's process limits do not (peer.go). The login cache
		// is Dovecot's (--auth-cache): off, or the same lifetime.
		qcfg := filepath.Join(root, name+".toml")
		qtoml := fmt.Sprintf("[limits]\nmax_connections_per_ip = 5000\n\n[auth]\ncache_ttl = %q\n", quillCacheTTL(authTTL))
		if err := os.WriteFile(qcfg, []byte(qtoml), 0o644); err != nil {
			return nil, err
		}
		admin := "127.0.0.1:0"
		if name == "quill" {
			admin = adminAddr(o)
		}
		c, addrs, err := startChild(ctx, root, name, true, bin, "serve",
			"--config", qcfg, "--data", data, "--domain", domain, "--hostname", "quill.bench.invalid", "--print-listeners",
			"--smtp-addr", "127.0.0.1:0", "--pop3-addr", "127.0.0.1:0",
			"--submission-addr", "off", "--submissions-addr", "off", "--lmtp-addr", "off", "--pop3s-addr", "off",
			"--imap-addr", imapAddr, "--imaps-addr", "off", "--admin-addr", admin)
		if err != nil {
			return nil, err
		}
		stops = append(stops, c.stop)
		targets = append(targets, target{name: name, smtp: addrs["smtp"], pop3: addrs["pop3"], imap: addrs["imap"],
			procs: map[string]int{"quill": c.pid()}, alive: c.running, syncs: true})
		return addrs, nil
	}
	if wanted("quill") {
		if qaddrs, err = startQuill("quill", filepath.Join(bin, "quill"), qdata); err != nil {
			return err
		}
	}
	if o.baseline != "" {
		baseBin, err := buildBaseline(ctx, root, o.baseline)
		if err != nil {
			return err
		}
		if _, err := startQuill("baseline", baseBin, filepath.Join(root, "baseline-data")); err != nil {
			return err
		}
	}
	if wanted("peer") {
		pr, err := startPeer(ctx, root, domain, all, hash, authTTL)
		if err != nil {
			return err
		}
		defer pr.stop(ctx)
		peerProcs, err := pr.processes()
		if err != nil {
			return err
		}
		targets = append(targets, target{name: "peer", smtp: pr.smtpAddr, pop3: pr.pop3Addr, imap: pr.imapAddr, procs: peerProcs, alive: pr.dovecot.running, syncs: true,
			settle: func(ctx context.Context) error { return pr.waitQueueEmpty(ctx, 5*time.Minute) }})
	}
	sinks := []struct {
		name            string
		args            []string
		smtpOnly, syncs bool
	}{
		// The sink stores nothing: SMTP only, no retrieval, no probes.
		{"sink", nil, true, false},
		// The durable sink keeps what it accepts but does not give it
		// back: SMTP only, like the sink.
		{"durable-sink", []string{"--durable", filepath.Join(root, "durable-sink-data")}, true, true},
		// The mail floor runs the whole mix.
		{"mail-floor", []string{"--durable", filepath.Join(root, "mail-floor-data"), "--pop3-addr", "127.0.0.1:0", "--password", password}, false, true},
		// So does the volatile floor, never syncing.
		{"volatile-floor", []string{"--durable", filepath.Join(root, "volatile-floor-data"), "--no-sync", "--pop3-addr", "127.0.0.1:0", "--password", password}, false, false},
	}
	for _, sk := range sinks {
		if !wanted(sk.name) {
			continue
		}
		c, addrs, err := startChild(ctx, root, sk.name, true, filepath.Join(bin, "quill-sink"),
			append([]string{"--addr", "127.0.0.1:0", "--domain", domain, "--print-listeners"}, sk.args...)...)
		if err != nil {
			return err
		}
		defer c.stop()
		targets = append(targets, target{name: sk.name, smtp: addrs["smtp"], pop3: addrs["pop3"],
			procs: map[string]int{sk.name: c.pid()}, alive: c.running, smtpOnly: sk.smtpOnly, syncs: sk.syncs})
	}

	if len(targets) == 0 {
		return errors.New("--only: nothing to run (the mail floors serve POP3 only)")
	}

	// Per connection mode, per target, a summary per round.
	results := map[string]map[string][]loadgen.MixSummary{}
	saturation := map[string]map[string][]loadgen.SaturationResult{}
	disk := map[string]map[string][]probeStats{}
	for _, m := range o.modes {
		results[m.name] = map[string][]loadgen.MixSummary{}
		saturation[m.name] = map[string][]loadgen.SaturationResult{}
		disk[m.name] = map[string][]probeStats{}
	}
	probe, err := newDiskProbe(root)
	if err != nil {
		return fmt.Errorf("disk probe: %w", err)
	}
	defer probe.close()
	seed := uint64(time.Now().UnixNano())
	if o.warmup > 0 {
		if err := warmUp(ctx, o, base, targets, seed); err != nil {
			return err
		}
	}
	for round := 0; round < o.rounds; round++ {
		for _, t := range targets {
			// The modes of a target run back to back, so that the ratio of
			// their costs is measured in one round on one store; their
			// order alternates from round to round, so that neither always
			// runs first on a store (or a login cache) that the other then
			// finds warmer.
			for k := range o.modes {
				mi := (k + round) % len(o.modes)
				m := o.modes[mi]
				cfg := t.mixConfig(base)
				cfg.MessagesPerConn = m.perConn
				cfg.Spec.Seed = seed + uint64(round)
				cfg.Spec.RunID = fmt.Sprintf("%s-r%d-%s-%s", strconv.FormatUint(seed, 36), round, t.name, m.name)
				if err := t.alive(); err != nil {
					return err
				}
				writeBack()
				fmt.Fprintf(os.Stderr, "compare: round %d: %s, %s ...\n", round+1, t.name, m.heading)
				res := results[m.name]
				ran := len(res[t.name])
				probe.start(diskProbeInterval)
				var err error
				if o.saturate {
					err = saturateOnce(ctx, o, cfg, t, probe, res, saturation[m.name])
				} else {
					err = runOnce(ctx, o, cfg, t.name, round == 0 && k == 0, qaddrs["admin"], qdata, res)
				}
				ps := probe.finish()
				if err != nil {
					return fmt.Errorf("%s round %d (%s): %w", t.name, round+1, m.name, err)
				}
				fmt.Fprintf(os.Stderr, "compare: %s round %d (%s): %v\n", t.name, round+1, m.name, ps)
				if len(res[t.name]) > ran { // a search that passed no rate adds no run
					disk[m.name][t.name] = append(disk[m.name][t.name], ps)
				}
				if t.settle != nil {
					if err := t.settle(ctx); err != nil {
						return err
					}
				}
			}
		}
	}
	if o.out != "" {
		out := map[string]any{"options": fmt.Sprintf("%+v", o), "machine": machine(), "results_by_conns": results, "disk_probe_by_conns": disk}
		if o.saturate {
			out["saturation"] = saturation
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		if err := os.WriteFile(o.out, b, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("machine: %s\n", machine())
	runs := fmt.Sprintf("%d clients, %v per run", o.clients, o.duration)
	if o.saturate {
		runs = fmt.Sprintf("at most %d clients in flight", o.clients)
	}
	fmt.Printf("workload: %d users, zipf s=%v, sizes %s, %.0f%% %s, %s, %d rounds\n",
		o.users, o.zipf, o.sizes, 100*o.pop3Share, strings.ToUpper(o.retrieval), runs, o.rounds)
	cache := "no credential cache on either server (every login runs argon2id)"
	if authTTL > 0 {
		cache = fmt.Sprintf("credential caches of %v on both servers (Quill's login cache, Dovecot's auth_cache)", authTTL)
	}
	fmt.Printf("fairness: %s; Quill serves IMAP as Dovecot does; a run is disturbed when other processes used more than %.0f%% of the machine during its load\n",
		cache, 100*o.maxOther)
	if o.saturate {
		fmt.Printf("saturation search: open loop from %.0f tx/s, x%v per step (a failure retried %d times), %d refinements, %v steps;\n"+
			"a rate passes when at most %.0f%% of its SMTP transactions failed, never started or took longer than %v;\n"+
			"a durable target's failure during which the disk probe saw an fdatasync longer than that is run again, up to %d times a search;\n"+
			"each column is the run at the highest rate that passed\n",
			o.startRate, o.factor, o.retries, o.refine, o.step, 100*o.maxShare, o.bound, o.disturbed)
	}
	for _, m := range o.modes {
		fmt.Printf("\n== %s\n", m.heading)
		kept, dropped, total := undisturbed(results[m.name], o.maxOther)
		if dropped > 0 {
			fmt.Printf("%d of %d runs disturbed (others used more than %.0f%% of the machine): left out of the medians\n", dropped, total, 100*o.maxOther)
		}
		if err := printComparison(os.Stdout, kept); err != nil {
			return err
		}
		fmt.Println()
		if err := printRounds(os.Stdout, results[m.name], disk[m.name], o.saturate, o.maxOther); err != nil {
			return err
		}
	}
	if len(o.modes) > 1 {
		fmt.Println()
		return printConnCost(os.Stdout, o.modes[0].name, o.modes[1].name, results, o.maxOther)
	}
	return nil
}

// parseAuthCache parses --auth-cache: 0 for off, else the lifetime.
func parseAuthCache(v string) (time.Duration, error) {
	if v == "off" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--auth-cache %q: want off or a positive duration such as 5m", v)
	}
	return d, nil
}

// quillCacheTTL is Quill's auth.cache_ttl for a credential cache lifetime
// (0: off, which Quill spells as a negative duration).
func quillCacheTTL(d time.Duration) string {
	if d <= 0 {
		return "-1s"
	}
	return d.String()
}

// diskProbeInterval is how often the disk probe syncs during a run.
const diskProbeInterval = 50 * time.Millisecond

// warmUp runs the mix for o.warmup against every target that stores mail
// and keeps nothing of it, so that the measured rounds find each store in
// its steady state: mailboxes holding what retrieval has not yet taken,
// and, for Quill, an LSM whose compactions have grown with it. On a fresh
// store the first minutes are faster than what a server sustains. The
// sinks store nothing that ages, and are left as they are.
func warmUp(ctx context.Context, o options, base loadgen.MixConfig, targets []target, seed uint64) error {
	for _, t := range targets {
		if t.smtpOnly {
			continue
		}
		cfg := t.mixConfig(base)
		cfg.Rate, cfg.Duration = 0, o.warmup
		cfg.Spec.Seed = seed - 1
		cfg.Spec.RunID = fmt.Sprintf("%s-warmup-%s", strconv.FormatUint(seed, 36), t.name)
		if err := t.alive(); err != nil {
			return err
		}
		writeBack()
		fmt.Fprintf(os.Stderr, "compare: warming up %s for %v ...\n", t.name, o.warmup)
		sum, err := loadgen.RunMix(ctx, cfg)
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("%s warm-up: %w", t.name, err)
		}
		fmt.Fprintf(os.Stderr, "compare: %s warmed up: %.1f delivered msg/s, %.1f retrieved msg/s\n",
			t.name, sum.Delivery.MsgPerSec, sum.POP3.MsgPerSec)
		if t.settle != nil {
			if err := t.settle(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeBack writes every dirty page back (sync(2)) before a run, so that
// no run's fdatasyncs wait behind what an earlier one left in the page
// cache. The volatile floor never syncs: the gigabytes it writes were
// otherwise written back during the next target's run, which then measured
// the disk (a Quill round after the floors' warm-ups: 571 delivered msg/s
// on 4 CPU-s, against 4,878 on 24 CPU-s in the next round).
func writeBack() {
	start := time.Now()
	syscall.Sync()
	if d := time.Since(start); d > 100*time.Millisecond {
		fmt.Fprintf(os.Stderr, "compare: wrote back dirty pages in %v\n", d.Round(time.Millisecond))
	}
}

// runOnce runs the mix once against one target and adds its summary to
// results; Quill's first run is profiled when --cpuprofile asks.
func runOnce(ctx context.Context, o options, cfg loadgen.MixConfig, name string, first bool, admin, qdata string,
	results map[string][]loadgen.MixSummary) error {
	var profiled chan error
	if name == "quill" && first && o.cpuprofile != "" {
		profiled = make(chan error, 1)
		go func() { profiled <- cpuProfile(ctx, admin, qdata, o.duration, o.cpuprofile) }()
	}
	sum, err := loadgen.RunMix(ctx, cfg)
	if profiled != nil {
		if perr := <-profiled; perr != nil {
			fmt.Fprintf(os.Stderr, "compare: cpu profile: %v\n", perr)
		}
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return err
	}
	_ = sum.WriteTable(os.Stderr)
	results[name] = append(results[name], sum)
	return nil
}

// saturateOnce runs one saturation search against a target, prints its
// steps, and adds the search to saturation and its peak run to results. A
// step that fails while the disk probe sees a sync longer than the latency
// bound is run again (up to --disturbed times): every durable target waits
// for such a sync before it acknowledges, so that step measured the disk of
// a shared host, and a search ended by it would report the disk's stall
// rather than the server's peak. A target that never syncs (the sink, the
// volatile floor) waits for no sync, so a stall does not explain its
// failures; nor does it explain a step far beyond a server's capacity, but
// such a step fails again when run again, so it costs time, not accuracy.
func saturateOnce(ctx context.Context, o options, cfg loadgen.MixConfig, t target, probe *diskProbe,
	results map[string][]loadgen.MixSummary, saturation map[string][]loadgen.SaturationResult) error {
	name := t.name
	sc := loadgen.SaturationConfig{
		StartRate: o.startRate, Factor: o.factor, Step: o.step, Bound: o.bound,
		MaxShare: o.maxShare, MaxSteps: 30, Refine: o.refine, Retries: o.retries,
	}
	if t.syncs {
		sc.MaxDisturbed = o.disturbed
		sc.Disturbed = func(start, end time.Time) string {
			if d := probe.longestDuring(start, end); d > o.bound {
				return fmt.Sprintf("the disk probe saw an fdatasync of %.0f ms", ms(d))
			}
			return ""
		}
	}
	res, err := loadgen.Saturate(ctx, cfg, sc)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return err
	}
	printSteps(os.Stderr, name, res, o.bound)
	saturation[name] = append(saturation[name], res)
	if res.PeakStep < 0 {
		fmt.Fprintf(os.Stderr, "compare: %s passed no rate: this round adds no peak to its column\n", name)
		return nil
	}
	results[name] = append(results[name], res.Steps[res.PeakStep].Summary)
	return nil
}

// target is one server under test.
type target struct {
	name             string
	smtp, pop3, imap string
	procs            map[string]int
	alive            func() error
	settle           func(context.Context) error // after each run
	smtpOnly         bool
	// syncs: the target fdatasyncs before it acknowledges, so a stalled
	// disk can fail its saturation steps (saturateOnce).
	syncs bool
}

// mixConfig is base aimed at t: its addresses and processes, and no
// retrieval, probes or sample for a target that only accepts.
func (t target) mixConfig(base loadgen.MixConfig) loadgen.MixConfig {
	cfg := base
	cfg.SMTPAddr, cfg.POP3Addr, cfg.IMAPAddr, cfg.Processes = t.smtp, t.pop3, t.imap, t.procs
	if t.smtpOnly {
		cfg.Mix, cfg.Probes, cfg.Sample = loadgen.Mix{}, nil, nil
	}
	return cfg
}

// provisionQuill loads the users straight into a new embedded store, as
// auth.Directory.AddUser would (user record, INBOX, the default
// mailboxes), but with one precomputed password hash: argon2id per user
// would take hours for a million users. Concurrent writers share the
// engine's group commits.
func provisionQuill(ctx context.Context, data string, users []string, hash string) error {
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	st, err := embedded.Open(filepath.Join(data, server.StoreDir), embedded.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for w := range errs {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(users)) || ctx.Err() != nil {
					return
				}
				u := users[i]
				if err := st.CreateUser(ctx, store.User{Address: u, PasswordHash: hash}); err != nil && !errors.Is(err, store.ErrExists) {
					errs[w] = fmt.Errorf("%s: %w", u, err)
					return
				}
				for _, m := range auth.DefaultMailboxes {
					_, err := st.CreateMailbox(ctx, u, m.Name, store.MailboxOptions{SpecialUse: m.SpecialUse, Subscribed: true})
					if err != nil && !errors.Is(err, store.ErrExists) {
						errs[w] = fmt.Errorf("%s %s: %w", u, m.Name, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

// machine describes the host for the report.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range splitLines(string(b)) {
			if k, v, ok := cutField(line); ok && k == "model name" {
				model = v
				break
			}
		}
	}
	kernel, _ := exec.Command("uname", "-r").Output()
	return fmt.Sprintf("%d CPUs (%s), Linux %s, %s", runtime.NumCPU(), model, trimNL(string(kernel)), runtime.Version())
}

// adminAddr enables quill's admin listener only when a profile is wanted.
func adminAddr(o options) string {
	if o.cpuprofile != "" {
		return "127.0.0.1:0"
	}
	return "off"
}

// cpuProfile fetches a CPU profile covering d from quill's admin endpoint
// (/debug/pprof/profile, behind the data directory's admin token).
func cpuProfile(ctx context.Context, admin, data string, d time.Duration, out string) error {
	token, err := os.ReadFile(filepath.Join(data, server.AdminTokenFile))
	if err != nil {
		return err
	}
	secs := max(1, int(d/time.Second))
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// buildBaseline builds the quill binary of git revision rev of the
// repository the harness runs in, from a clean export of that revision
// (git archive), and returns its path.
func buildBaseline(ctx context.Context, root, rev string) (string, error) {
	src := filepath.Join(root, "baseline-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return "", fmt.Errorf("--baseline %s: exporting the revision: %w\n%s", rev, err, out)
	}
	bin := filepath.Join(root, "bin", "quill-baseline")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/quill")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("--baseline %s: building: %w\n%s", rev, err, out)
	}
	fmt.Fprintf(os.Stderr, "compare: baseline is quill at %s\n", rev)
	return bin, nil
}
