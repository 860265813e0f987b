package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"quill/internal/config"
	"quill/internal/procs"
	"quill/internal/server"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func serve(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", "", "TOML configuration file (optional)")
	data := fs.String("data", "", "data directory (default ./quill-data)")
	hostname := fs.String("hostname", "", "host name in greetings and Received fields")
	var domains listFlag
	fs.Var(&domains, "domain", "local mail domain (repeatable; default localhost)")
	printListeners := fs.Bool("print-listeners", false, "print the bound listener addresses as one JSON line on stdout once ready")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	clusterAddr := fs.String("cluster-addr", "", "host:port of the node-to-node listener (TCP and UDP), or off (a single node)")
	join := fs.String("join", "", "host:port[,host:port...] of any live nodes of the cluster to join")
	addrs := map[string]*string{}
	for _, name := range []string{"smtp", "submission", "submissions", "lmtp", "pop3", "pop3s", "imap", "imaps", "admin"} {
		addrs[name] = fs.String(name+"-addr", "", "host:port of the "+name+" listener, or off")
	}
	if rest, err := parse(fs, args); err != nil {
		return err
	} else if len(rest) > 0 {
		return usageError(fmt.Sprintf("serve: unexpected arguments %q", rest))
	}

	cfg := config.Default()
	if *configFile != "" {
		var err error
		if cfg, err = config.Load(*configFile); err != nil {
			return err
		}
	}
	if *data != "" {
		cfg.DataDir = *data
	}
	if *hostname != "" {
		cfg.Hostname = *hostname
	}
	if len(domains) > 0 {
		cfg.Domains = domains
	}
	if *logLevel != "" {
		cfg.Log.Level = *logLevel
	}
	if *clusterAddr != "" {
		cfg.Cluster.Addr = *clusterAddr
	}
	if *join != "" {
		cfg.Cluster.Join = strings.Split(*join, ",")
	}
	l := &cfg.Listeners
	for name, dst := range map[string]*string{
		"smtp": &l.SMTP, "submission": &l.Submission, "submissions": &l.Submissions, "lmtp": &l.LMTP,
		"pop3": &l.POP3, "pop3s": &l.POP3S, "imap": &l.IMAP, "imaps": &l.IMAPS, "admin": &l.Admin,
	} {
		if v := *addrs[name]; v != "" {
			*dst = v
		}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	log, closeLog := newLogger(cfg.Log, stderr)
	defer closeLog()
	if from, to, ok := procs.Raise(); ok {
		log.Info("scheduler threads raised to twice the CPUs (set GOMAXPROCS to choose)", "from", from, "to", to)
	}
	hp, stopHugePages := procs.CollapseHeap(procs.HugePagesInterval)
	defer stopHugePages()
	log.Info("heap in huge pages", "active", hp.Active, "reason", hp.Reason)

	srv, err := server.New(cfg, log)
	if err != nil {
		return err
	}
	// Signals are caught before Start so that an early SIGTERM drains too.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := srv.Start(); err != nil {
		return err
	}
	if *printListeners {
		b, _ := json.Marshal(srv.Listeners())
		fmt.Fprintf(stdout, "%s\n", b)
	}
	var runErr error
	select {
	case sig := <-sigs:
		log.Info("signal received; draining (send another to exit at once)", "signal", sig.String())
	case runErr = <-srv.Errors():
		log.Error("listener failed; shutting down", "err", runErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Limits.ShutdownTimeout.Duration)
	defer cancel()
	go func() {
		// A second signal abandons the drain.
		<-sigs
		log.Warn("second signal: exiting now")
		closeLog()
		os.Exit(1)
	}()
	if err := srv.Shutdown(ctx); err != nil {
		return err
	}
	return runErr
}

// newLogger returns the logger c describes, writing to w, and the function
// that writes out what it holds back; call it before the process exits.
func newLogger(c config.Log, w io.Writer) (*slog.Logger, func()) {
	var level slog.Level
	level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	var lw *logWriter
	if c.FlushInterval.Duration > 0 {
		lw = newLogWriter(w, c.FlushInterval.Duration)
		w = lw
	}
	var h slog.Handler
	if c.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = newTextHandler(w, opts)
	}
	if lw == nil {
		return slog.New(h), func() {}
	}
	return slog.New(logFlusher{h, lw}), lw.Close
}
