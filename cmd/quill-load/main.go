// Command quill-load drives a mail server with SMTP load and reports the
// acknowledged throughput and latency. It is a thin front end over
// quill/internal/loadgen.
//
//	quill-load smtp --addr 127.0.0.1:2525 --rcpt-domain example.test --users 100 \
//	    --concurrency 16 --duration 10s --size 4700 [--json]
//	quill-load mix --smtp-addr 127.0.0.1:2525 --pop3-addr 127.0.0.1:1110 \
//	    --rcpt-domain example.test --password PW --users 10000 --duration 30s [--json]
//	quill-load mix --retrieval imap --imap-addr 127.0.0.1:1143 ... (IMAP sessions)
//	quill-load saturate ... (the mix flags) --latency-bound 100ms
//
// Recipients are user0000@DOMAIN .. user(N-1)@DOMAIN; the caller provisions
// them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"quill/internal/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: quill-load smtp|mix|saturate [flags]

Sub-commands:
  smtp      deliver generated messages over SMTP connections, persistent or
            (--messages-per-conn 1) one message per connection
  mix       the Porcupine mix: Zipf recipients, lognormal sizes, ~90% SMTP
            deliveries and ~10% retrieval sessions, POP3 or (--retrieval imap
            --imap-addr H:P) IMAP; reports accepted, delivered and retrieved
            msg/s, latencies, end-to-end delay and server CPU
  saturate  the mix, open loop, at rising rates until a latency bound breaks
`

// run is main without the process: it returns the exit status (0 success,
// 1 run failure, 2 usage).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "mix":
			return mixCmd(ctx, args[1:], stdout, stderr)
		case "saturate":
			return saturateCmd(ctx, args[1:], stdout, stderr)
		}
	}
	if len(args) == 0 || args[0] != "smtp" {
		fmt.Fprint(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("quill-load smtp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "SMTP listener `host:port` (required)")
	domain := fs.String("rcpt-domain", "", "recipient `domain` (required)")
	users := fs.Int("users", 100, "number of recipient mailboxes user0000@DOMAIN...")
	concurrency := fs.Int("concurrency", 16, "connections open at once")
	perConn := fs.Int("messages-per-conn", 0, "messages per SMTP connection before QUIT and a new one (1: one per connection, as Porcupine and postal; 0: persistent)")
	duration := fs.Duration("duration", 0, "stop starting transactions after this long")
	count := fs.Int64("count", 0, "stop after this many messages")
	rate := fs.Float64("rate", 0, "open loop: messages offered per second, --concurrency bounding those in flight (0: closed loop)")
	size := fs.Int("size", 4700, "message size in octets")
	seed := fs.Uint64("seed", 0, "message seed (0: derived from the clock, printed)")
	from := fs.String("from", "loadgen@quill-load.invalid", "envelope sender and From address")
	timeout := fs.Duration("timeout", time.Minute, "bound on every server reply")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	verbose := fs.Bool("v", false, "log connection failures to stderr")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	switch {
	case *addr == "" || *domain == "":
		fmt.Fprintln(stderr, "quill-load smtp: --addr and --rcpt-domain are required")
		return 2
	case *users <= 0 || *concurrency <= 0 || *size <= 0 || *count < 0 || *duration < 0 || *perConn < 0 || *rate < 0:
		fmt.Fprintln(stderr, "quill-load smtp: --users, --concurrency and --size must be positive, --messages-per-conn and --rate not negative")
		return 2
	case *count == 0 && *duration == 0:
		fmt.Fprintln(stderr, "quill-load smtp: give --count or --duration (or both)")
		return 2
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "quill-load smtp: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	cfg := loadgen.Config{
		Addr: *addr,
		Spec: loadgen.Spec{
			Seed:  *seed,
			RunID: strconv.FormatUint(*seed, 36),
			From:  *from,
			Sizes: loadgen.FixedSize(*size),
			Rcpts: loadgen.Uniform{Users: loadgen.UserNames(*domain, *users)},
		},
		Concurrency:     *concurrency,
		MessagesPerConn: *perConn,
		Count:           *count,
		Duration:        *duration,
		Rate:            *rate,
		Timeout:         *timeout,
		Logger:          logger,
	}
	sum, err := loadgen.Run(ctx, cfg)
	if errors.Is(err, loadgen.ErrAllWorkersFailed) {
		fmt.Fprintf(stderr, "quill-load smtp: %v (is %s listening?)\n", err, *addr)
	} else if err != nil {
		fmt.Fprintf(stderr, "quill-load smtp: %v\n", err)
		return 1
	}
	if *asJSON {
		out := struct {
			Seed        uint64 `json:"seed"`
			Concurrency int    `json:"concurrency"`
			Size        int    `json:"size"`
			loadgen.Summary
		}{*seed, *concurrency, *size, sum}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "quill-load smtp: %v\n", err)
			return 1
		}
	} else {
		printTable(stdout, *seed, *concurrency, *size, sum)
	}
	if err != nil {
		return 1
	}
	return 0
}

// printTable writes sum for a human.
func printTable(w io.Writer, seed uint64, concurrency, size int, sum loadgen.Summary) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("seed", seed)
	row("connections", fmt.Sprintf("%d at once, %d opened", concurrency, sum.Connections))
	row("message size", size)
	row("elapsed", sum.Elapsed.Round(time.Millisecond))
	row("attempted", sum.Attempted)
	row("acked", sum.Acked)
	row("rejected", sum.Rejected)
	row("no reply", sum.NoReply)
	row("acked msg/s", fmt.Sprintf("%.1f", sum.MsgPerSec))
	if sum.Elapsed > 0 {
		row("acked MB/s", fmt.Sprintf("%.2f", float64(sum.AckedBytes)/1e6/sum.Elapsed.Seconds()))
	}
	row("latency p50", sum.Latency.P50.Round(time.Microsecond))
	row("latency p90", sum.Latency.P90.Round(time.Microsecond))
	row("latency p99", sum.Latency.P99.Round(time.Microsecond))
	row("latency max", sum.Latency.Max.Round(time.Microsecond))
	codes := make([]int, 0, len(sum.RejectCodes))
	for c := range sum.RejectCodes {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		row(fmt.Sprintf("rejected %d", c), sum.RejectCodes[c])
	}
	kinds := make([]string, 0, len(sum.Errors))
	for k := range sum.Errors {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		row("errors "+k, sum.Errors[k])
	}
	tw.Flush()
}
