// Command quill-sink is an SMTP server that stores nothing: Quill's own
// SMTP front end (internal/smtp, with its parser, limits and pipelining)
// over a backend that accepts every recipient in its domains and reads each
// message to the end and discards it. It is the protocol-bound upper limit
// of the benchmark in bench/: whatever Quill delivers per second, it cannot
// exceed what its front end alone sustains on the same machine.
//
//	quill-sink --addr 127.0.0.1:0 --domain example.test --print-listeners
//
// It never acknowledges durability it does not have: do not point real mail
// at it.
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
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("quill-sink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:2525", "SMTP listener `host:port` (port 0: any free port)")
	hostname := fs.String("hostname", "sink.quill.invalid", "host name in the greeting and trace fields")
	var domains listFlag
	fs.Var(&domains, "domain", "local `domain` whose every address is accepted (repeatable; default localhost)")
	printListeners := fs.Bool("print-listeners", false, `print {"smtp":"host:port"} on stdout once listening`)
	maxConns := fs.Int("max-conns", 1000, "concurrent connections")
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
	srv := &smtp.Server{
		Mode:     smtp.ModeMX,
		Hostname: *hostname,
		Backend:  &sink{domains: domains},
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

// sink is the no-storage backend.
type sink struct {
	domains []string
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

// Deliver reads the message to its end (the front end bounds it) and
// reports every recipient delivered.
func (*sink) Deliver(_ context.Context, m delivery.Message) ([]error, error) {
	if _, err := io.Copy(io.Discard, m.Body); err != nil {
		return nil, fmt.Errorf("sink: reading body: %w", err)
	}
	return make([]error, len(m.Recipients)), nil
}
