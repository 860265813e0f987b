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
// itself, and the gap between Quill and it is the cost of Quill's store.
//
// What a 250 means: without --durable, only that the message was read to
// its end. With --durable, that the whole message (trace fields included)
// is in DIR/sink.log with a valid CRC-32C and covered by a completed
// fdatasync, so it survives a crash or power loss of this host (as far as
// the disk honours flushes); a failed write or sync answers 451 and stops
// every later acknowledgement. Neither mode is a mail server: nothing can
// read the mail back, so do not point real mail at it.
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
	"strings"
	"syscall"
	"time"

	"quill/internal/auth"
	"quill/internal/delivery"
	"quill/internal/mail"
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
	printListeners := fs.Bool("print-listeners", false, `print {"smtp":"host:port"} on stdout once listening`)
	maxConns := fs.Int("max-conns", 1000, "concurrent connections")
	durable := fs.String("durable", "", "append every message to `dir`/"+logName+" and fdatasync it before the reply (the durability floor)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if len(domains) == 0 {
		domains = listFlag{"localhost"}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	backend := &sink{domains: domains}
	if *durable != "" {
		l, err := openDurableLog(*durable, log)
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
		backend.log = l
	}
	srv := &smtp.Server{
		Mode:     smtp.ModeMX,
		Hostname: *hostname,
		Backend:  backend,
		Logger:   log,
		Limiter:  textconn.NewLimiter(*maxConns, *maxConns),
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	if *printListeners {
		b, _ := json.Marshal(map[string]string{"smtp": ln.Addr().String()})
		fmt.Fprintf(stdout, "%s\n", b)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, textconn.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// sink is the backend: it discards every message, or with log set appends
// it to the durable log.
type sink struct {
	domains []string
	log     *durableLog // nil: discard
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
	d := rcpt.DomainNormalized()
	for _, local := range s.domains {
		if d == local {
			return delivery.Recipient{Address: rcpt, User: rcpt.Normalized()}, nil
		}
	}
	return delivery.Recipient{}, delivery.ErrRelayDenied
}

// Deliver reads the message to its end (the front end bounds it), appends
// it to the durable log if there is one, and reports every recipient
// delivered. An error from the log fails the whole message: the front end
// answers it with a temporary failure, never a 250.
func (s *sink) Deliver(ctx context.Context, m delivery.Message) ([]error, error) {
	if s.log != nil {
		if err := s.log.Append(ctx, m.Body); err != nil {
			return nil, err
		}
	} else if _, err := io.Copy(io.Discard, m.Body); err != nil {
		return nil, fmt.Errorf("sink: reading body: %w", err)
	}
	return make([]error, len(m.Recipients)), nil
}
