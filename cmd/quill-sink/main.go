// Command quill-sink is an SMTP server that stores nothing: Quill's own
// SMTP front end (internal/smtp, with its parser, limits and pipelining)
// over a backend that accepts every recipient in its domains and reads each
// message to the end and discards it. It is the protocol-bound upper limit
// of the benchmark in bench/: whatever Quill delivers per second, it cannot
// exceed what its front end alone sustains on the same machine.
//
//	quill-sink --addr 127.0.0.1:0 --domain example.test --print-listeners
//
// With --durable DIR it is instead the durability floor: the same front
// end, and each message appended as one checksummed record to DIR/sink.log
// and made durable by an fdatasync, shared by concurrent deliveries (group
// commit), before the reply. There is no index and no retrieval: it is the
// cheapest SMTP server on this machine that acknowledges only what is on
// disk, so the gap between it and the plain sink is the cost of durability
// itself.
//
// With --durable DIR and --pop3-addr it is the mail floor: the durable log
// plus an index in memory of each user's messages (rebuilt from the log on
// start), served over Quill's own POP3 front end (internal/pop3) with one
// password (--password) for every user in its domains. RETR reads from the
// log; DELE+QUIT appends an expunge record and syncs it before +OK. It is
// the cheapest server on this machine that does everything the Porcupine
// mix asks of a mail server, at Quill's durability, and nothing else: the
// gap between Quill and it is the cost of Quill's store and its features.
//
// With --no-sync as well it is the volatile floor: the mail floor that
// never calls fdatasync. It is the mix with durability left out, the same
// work on the same front ends: the gap from it to the mail floor is what
// durability costs the mix.
//
// What a 250 means: without --durable, only that the message was read to
// its end. With --durable --no-sync, that it is written to DIR/sink.log:
// it survives a crash of the process, not of the host. With --durable
// alone, that the whole message (trace fields included) and its
// recipients are in DIR/sink.log with a valid CRC-32C and covered by a
// completed fdatasync, so it survives a crash or power loss of this host
// (as far as the disk honours flushes). A failed write or sync answers 451
// (POP3: -ERR) and stops every later acknowledgement. None of
// the modes is a mail server to run: there are no accounts, no IMAP, no
// quotas, and the log never shrinks; do not point real mail at it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"quill/internal/auth"
	"quill/internal/delivery"
	"quill/internal/mail"
	"quill/internal/pop3"
	"quill/internal/procs"
	"quill/internal/smtp"
	"quill/internal/textconn"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "quill-sink: %v\n", err)
		os.Exit(1)
	}
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, strings.ToLower(v)); return nil }

// shutdownTimeout bounds the drain after a signal.
const shutdownTimeout = 10 * time.Second

// run serves until ctx ends, then drains.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("quill-sink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:2525", "SMTP listener `host:port` (port 0: any free port)")
	hostname := fs.String("hostname", "sink.quill.invalid", "host name in the greeting and trace fields")
	var domains listFlag
	fs.Var(&domains, "domain", "local `domain` whose every address is accepted (repeatable; default localhost)")
	printListeners := fs.Bool("print-listeners", false, `print {"smtp":"host:port"} (and "pop3") on stdout once listening`)
	maxConns := fs.Int("max-conns", 1000, "concurrent connections")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to `file`")
	durable := fs.String("durable", "", "append every message to `dir`/"+logName+" and fdatasync it before the reply (the durability floor)")
	pop3Addr := fs.String("pop3-addr", "", "with --durable, serve the mail over POP3 on `host:port` (the mail floor)")
	password := fs.String("password", "", "with --pop3-addr, the `password` of every user")
	noSync := fs.Bool("no-sync", false, "with --durable, never fdatasync: acknowledge what is written to the page cache (with --pop3-addr, the volatile floor)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *noSync && *durable == "" {
		return errors.New("--no-sync needs --durable")
	}
	if len(domains) == 0 {
		domains = listFlag{"localhost"}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The durable modes block threads in fdatasync and pread as Quill's
	// engine does, and gain from quill serve's scheduler setting; the
	// plain sink, all CPU, is fastest without it (22,600 against 18,300
	// msg/s under the 16-client mix). They also keep an index in memory
	// and run with quill serve's heap in huge pages; the plain sink's heap
	// is some 20 MB, and it was no faster with them (15,035-16,864
	// against 15,878-19,127 msg/s in three alternating pairs of 20 s runs
	// at 64 clients).
	if *durable != "" {
		procs.Raise()
		_, stopHugePages := procs.CollapseHeap(procs.HugePagesInterval)
		defer stopHugePages()
	}
	stopProfile, err := procs.CPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer func() {
		if perr := stopProfile(); err == nil {
			err = perr
		}
	}()
	backend := &sink{domains: domains}
	if *pop3Addr != "" {
		if *durable == "" || *password == "" {
			return errors.New("--pop3-addr needs --durable and --password")
		}
		backend.drops = newMaildrops(domains, *password)
	}
	if *durable != "" {
		var replay replayFunc
		if backend.drops != nil {
			replay = backend.drops.replay
		}
		l, err := openDurableLog(*durable, log, replay)
		if err != nil {
			return err
		}
		// Shutdown returns only when every session has ended, so no
		// Deliver is in flight when the log closes.
		defer func() {
			if cerr := l.Close(); err == nil {
				err = cerr
			}
		}()
		l.noSync = *noSync
		backend.log = l
		if backend.drops != nil {
			backend.drops.log = l
		}
	}
	limiter := textconn.NewLimiter(*maxConns, *maxConns)
	servers := []listener{{name: "smtp", addr: *addr, srv: &smtp.Server{
		Mode:     smtp.ModeMX,
		Hostname: *hostname,
		Backend:  backend,
		Logger:   log,
		Limiter:  limiter,
	}}}
	if backend.drops != nil {
		servers = append(servers, listener{name: "pop3", addr: *pop3Addr, srv: &pop3.Server{
			Hostname: *hostname,
			Backend:  backend.drops,
			Logger:   log,
			Limiter:  limiter,
		}})
	}
	addrs := map[string]string{}
	for i := range servers {
		if servers[i].ln, err = net.Listen("tcp", servers[i].addr); err != nil {
			for _, s := range servers[:i] {
				s.ln.Close()
			}
			return err
		}
		addrs[servers[i].name] = servers[i].ln.Addr().String()
	}
	if *printListeners {
		b, _ := json.Marshal(addrs)
		fmt.Fprintf(stdout, "%s\n", b)
	}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errc <- s.srv.Serve(s.ln) }()
	}
	served := 0 // Serve calls returned
	select {
	case err = <-errc: // a listener failed: stop the others
		served++
		if errors.Is(err, textconn.ErrServerClosed) {
			err = nil
		}
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	for _, s := range servers {
		if serr := s.srv.Shutdown(sctx); err == nil {
			err = serr
		}
	}
	// Every Serve returns once its server is shut down.
	for range len(servers) - served {
		if serr := <-errc; !errors.Is(serr, textconn.ErrServerClosed) && err == nil {
			err = serr
		}
	}
	return err
}

// listener is one of the sink's servers and its socket.
type listener struct {
	name, addr string
	ln         net.Listener
	srv        interface {
		Serve(net.Listener) error
		Shutdown(context.Context) error
	}
}

// sink is the backend: it discards every message, or with log set appends
// it to the durable log.
type sink struct {
	domains []string
	log     *durableLog // nil: discard
	drops   *maildrops  // nil: no index, no retrieval
}

var _ smtp.Backend = (*sink)(nil)

// Authenticate refuses everyone: the sink serves only ModeMX.
func (*sink) Authenticate(context.Context, string, string, netip.Addr) (string, error) {
	return "", auth.ErrInvalidCredentials
}

// CheckSender refuses every sender; it is only called after AUTH.
func (*sink) CheckSender(context.Context, string, mail.Address) error {
	return delivery.ErrSenderNotAllowed
}

// Resolve accepts any address in the sink's domains.
func (s *sink) Resolve(_ context.Context, rcpt mail.Address, _ delivery.ResolveOptions) (delivery.Recipient, error) {
	if !slices.Contains(s.domains, rcpt.DomainNormalized()) {
		return delivery.Recipient{}, delivery.ErrRelayDenied
	}
	return delivery.Recipient{Address: rcpt, User: rcpt.Normalized()}, nil
}

// Deliver reads the message to its end (the front end bounds it), appends
// it to the durable log if there is one, and reports every recipient
// delivered. An error from the log fails the whole message: the front end
// answers it with a temporary failure, never a 250.
func (s *sink) Deliver(ctx context.Context, m delivery.Message) ([]error, error) {
	if s.log != nil {
		users := make([]string, len(m.Recipients))
		for i, r := range m.Recipients {
			users[i] = r.User
		}
		loc, err := s.log.Append(ctx, users, m.Body)
		if err != nil {
			return nil, err
		}
		if s.drops != nil {
			s.drops.delivered(users, loc)
		}
	} else if _, err := io.Copy(io.Discard, m.Body); err != nil {
		return nil, fmt.Errorf("sink: reading body: %w", err)
	}
	return make([]error, len(m.Recipients)), nil
}
