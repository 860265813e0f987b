package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"quill/internal/loadgen"
	"quill/internal/procs"
)

// pidFlag collects --pid NAME=PID.
type pidFlag map[string]int

func (p pidFlag) String() string { return fmt.Sprint(map[string]int(p)) }
func (p pidFlag) Set(v string) error {
	name, pid, ok := strings.Cut(v, "=")
	n, err := strconv.Atoi(pid)
	if !ok || name == "" || err != nil || n <= 0 {
		return fmt.Errorf("want NAME=PID, got %q", v)
	}
	p[name] = n
	return nil
}

// mixFlags are the flags of the mix and saturate sub-commands.
type mixFlags struct {
	smtpAddr, pop3Addr, imapAddr, retrieval *string
	domain, password, sizes, from           *string
	cpuprofile                              *string
	users, clients, probes, sample, perConn *int
	zipf, pop3Share, rate                   *float64
	duration, drainTimeout, timeout, bound  *time.Duration
	seed                                    *uint64
	asJSON, verbose                         *bool
	pids                                    pidFlag
}

func addMixFlags(fs *flag.FlagSet) *mixFlags {
	f := &mixFlags{
		smtpAddr:     fs.String("smtp-addr", "", "SMTP listener `host:port` (required)"),
		pop3Addr:     fs.String("pop3-addr", "", "POP3 listener `host:port` (needed with --retrieval pop3 unless --pop3-share 0 --probes 0 --sample 0)"),
		imapAddr:     fs.String("imap-addr", "", "IMAP listener `host:port` allowing LOGIN (needed with --retrieval imap, as --pop3-addr)"),
		retrieval:    fs.String("retrieval", "pop3", "protocol of the retrieval sessions, the probes and the drain: pop3 or imap"),
		domain:       fs.String("rcpt-domain", "", "recipient `domain` (required)"),
		password:     fs.String("password", "", "every user's POP3/IMAP password"),
		sizes:        fs.String("sizes", "lognormal", "size distribution: lognormal[:MEAN[:SIGMA[:MAX]]], fixed:N, uniform:MIN-MAX, cassmail-small, cassmail-large"),
		from:         fs.String("from", "loadgen@quill-load.invalid", "envelope sender and From address"),
		users:        fs.Int("users", 10000, "population: user0000@DOMAIN..."),
		clients:      fs.Int("clients", 16, "concurrent clients"),
		perConn:      fs.Int("messages-per-conn", 0, "SMTP transactions per connection before QUIT and a new one (1: one per connection, as Porcupine and postal; 0: persistent)"),
		probes:       fs.Int("probes", 2, "end-to-end probe mailboxes probe00@DOMAIN... (provisioned by the caller; 0: no probes)"),
		sample:       fs.Int("sample", 16, "mailboxes sampled for the delivered rate (0: not measured)"),
		zipf:         fs.Float64("zipf", 1, "Zipf exponent of the recipients (0 uniform; large: all to few users)"),
		pop3Share:    fs.Float64("pop3-share", 0.1, "share of transactions that are retrieval sessions (POP3 or IMAP, see --retrieval)"),
		rate:         fs.Float64("rate", 0, "open loop: offered transactions per second (0: closed loop)"),
		duration:     fs.Duration("duration", 30*time.Second, "load phase"),
		drainTimeout: fs.Duration("drain-timeout", time.Minute, "bound on the drain of the sample"),
		timeout:      fs.Duration("timeout", time.Minute, "bound on every server reply"),
		bound:        fs.Duration("latency-bound", 0, "count SMTP transactions slower than this"),
		seed:         fs.Uint64("seed", 0, "message seed (0: derived from the clock, printed)"),
		asJSON:       fs.Bool("json", false, "print the summary as JSON"),
		verbose:      fs.Bool("v", false, "log connection failures to stderr"),
		cpuprofile:   fs.String("cpuprofile", "", "write a CPU profile of the generator itself to `file` (it shares the machine with the server)"),
		pids:         pidFlag{},
	}
	fs.Var(f.pids, "pid", "measure the CPU of the process tree `NAME=PID` (repeatable)")
	return f
}

// ProbeNames returns the probe mailboxes probe00@domain...
func probeNames(domain string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("probe%02d@%s", i, domain)
	}
	return out
}

// config builds the MixConfig, or returns a usage error.
func (f *mixFlags) config(fs *flag.FlagSet, stderr io.Writer) (loadgen.MixConfig, error) {
	switch {
	case *f.smtpAddr == "" || *f.domain == "":
		return loadgen.MixConfig{}, fmt.Errorf("--smtp-addr and --rcpt-domain are required")
	case *f.users <= 0 || *f.clients <= 0 || *f.probes < 0 || *f.sample < 0 || *f.duration <= 0 || *f.perConn < 0:
		return loadgen.MixConfig{}, fmt.Errorf("--users, --clients and --duration must be positive, --messages-per-conn not negative")
	case !(*f.pop3Share >= 0 && *f.pop3Share <= 1):
		return loadgen.MixConfig{}, fmt.Errorf("--pop3-share must be in [0, 1]")
	case *f.retrieval != loadgen.RetrievalPOP3 && *f.retrieval != loadgen.RetrievalIMAP:
		return loadgen.MixConfig{}, fmt.Errorf("--retrieval %q: want pop3 or imap", *f.retrieval)
	case fs.NArg() > 0:
		return loadgen.MixConfig{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	sizes, err := loadgen.ParseSizeDist(*f.sizes)
	if err != nil {
		return loadgen.MixConfig{}, err
	}
	users := loadgen.UserNames(*f.domain, *f.users)
	z, err := loadgen.NewZipf(users, *f.zipf)
	if err != nil {
		return loadgen.MixConfig{}, err
	}
	if *f.seed == 0 {
		*f.seed = uint64(time.Now().UnixNano())
	}
	logger := slog.New(slog.DiscardHandler)
	if *f.verbose {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	return loadgen.MixConfig{
		SMTPAddr:        *f.smtpAddr,
		Retrieval:       *f.retrieval,
		POP3Addr:        *f.pop3Addr,
		IMAPAddr:        *f.imapAddr,
		Spec:            loadgen.Spec{Seed: *f.seed, RunID: strconv.FormatUint(*f.seed, 36), From: *f.from, Sizes: sizes, Rcpts: z},
		Password:        *f.password,
		Mix:             loadgen.Mix{POP3PerMille: uint64(*f.pop3Share*1000 + 0.5)},
		Clients:         *f.clients,
		MessagesPerConn: *f.perConn,
		Rate:            *f.rate,
		Duration:        *f.duration,
		Probes:          probeNames(*f.domain, *f.probes),
		Sample:          loadgen.SampleMailboxes(users, *f.sample),
		DrainTimeout:    *f.drainTimeout,
		LatencyBound:    *f.bound,
		Processes:       f.pids,
		Timeout:         *f.timeout,
		Logger:          logger,
	}, nil
}

// mixCmd runs the Porcupine mix once.
func mixCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("quill-load mix", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := addMixFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := f.config(fs, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "quill-load mix: %v\n", err)
		return 2
	}
	stopProfile, err := procs.CPUProfile(*f.cpuprofile)
	if err != nil {
		fmt.Fprintf(stderr, "quill-load mix: %v\n", err)
		return 1
	}
	sum, err := loadgen.RunMix(ctx, cfg)
	if perr := stopProfile(); err == nil && perr != nil {
		err = perr
	}
	if err != nil {
		fmt.Fprintf(stderr, "quill-load mix: %v\n", err)
		return 1
	}
	if *f.asJSON {
		out := struct {
			Seed  uint64 `json:"seed"`
			Sizes string `json:"sizes"`
			Users int    `json:"users"`
			loadgen.MixSummary
		}{*f.seed, *f.sizes, *f.users, sum}
		return writeJSON(stdout, stderr, out)
	}
	fmt.Fprintf(stdout, "seed %d, sizes %s, %d users, zipf s=%v, retrieval %s\n", *f.seed, *f.sizes, *f.users, *f.zipf, *f.retrieval)
	if err := sum.WriteTable(stdout); err != nil {
		return 1
	}
	return 0
}

// saturateCmd raises the offered rate until the latency bound breaks.
func saturateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("quill-load saturate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := addMixFlags(fs)
	start := fs.Float64("start-rate", 50, "first offered rate, transactions/s")
	factor := fs.Float64("factor", 1.5, "rate multiplier per step")
	maxShare := fs.Float64("max-share", 0.05, "tolerated share of SMTP transactions over --latency-bound or failed")
	maxSteps := fs.Int("max-steps", 12, "most steps of the climb")
	retries := fs.Int("retries", 1, "times a failing step of the climb is run again before it ends the climb")
	refine := fs.Int("refine", 0, "narrowing steps after the first failure, each at the geometric mean of the highest pass and the lowest failure")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *f.bound == 0 {
		*f.bound = 100 * time.Millisecond
	}
	cfg, err := f.config(fs, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "quill-load saturate: %v\n", err)
		return 2
	}
	res, err := loadgen.Saturate(ctx, cfg, loadgen.SaturationConfig{
		StartRate: *start, Factor: *factor, Step: *f.duration, Bound: *f.bound, MaxShare: *maxShare, MaxSteps: *maxSteps, Refine: *refine, Retries: *retries,
	})
	if err != nil {
		fmt.Fprintf(stderr, "quill-load saturate: %v\n", err)
		return 1
	}
	if *f.asJSON {
		return writeJSON(stdout, stderr, res)
	}
	for _, st := range res.Steps {
		fmt.Fprintf(stdout, "offered %8.1f tx/s: accepted %8.1f msg/s, delivered %8.1f msg/s, smtp p99 %6.1f ms, %5.1f%% over %v: %s\n",
			st.Rate, st.Summary.SMTP.MsgPerSec, st.Summary.Delivery.MsgPerSec, float64(st.Summary.SMTP.Latency.P99)/1e6,
			100*st.Share, *f.bound, map[bool]string{true: "pass", false: "FAIL"}[st.Passed])
	}
	fmt.Fprintf(stdout, "peak: %.1f tx/s offered, %.1f msg/s delivered\n", res.PeakRate, res.PeakDelivered)
	return 0
}

func writeJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "quill-load: %v\n", err)
		return 1
	}
	return 0
}
