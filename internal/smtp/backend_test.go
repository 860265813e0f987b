package smtp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"

	"quill/internal/auth"
	"quill/internal/delivery"
	"quill/internal/mail"
)

// testBackend implements Backend with fixed rules and records deliveries.
// Local domains: example.org and the server's hostname mx.example.org.
// Local parts select behaviour: full (452), quota (552), disabled, tempfail
// (unclassified error at RCPT), and after DATA: late-quota (per-recipient
// ErrOverQuota), late-temp (per-recipient unclassified error). A body
// containing "X-Test-Storage-Fail" makes the whole Deliver fail.
type testBackend struct {
	discard bool // benchmarks: read and drop bodies

	mu       sync.Mutex
	messages []testMessage
}

type testMessage struct {
	from  mail.Address
	rcpts []delivery.Recipient
	body  []byte
}

var _ Backend = (*testBackend)(nil)

func (b *testBackend) Authenticate(_ context.Context, username, password string, _ netip.Addr) (string, error) {
	switch {
	case username == "throttled@example.org":
		return "", auth.ErrThrottled
	case username == "disabled@example.org" && password == "secret":
		return "", auth.ErrDisabled
	case username == "broken@example.org":
		return "", errors.New("user directory unreachable")
	case username == "alice@example.org" && password == "secret":
		return "alice@example.org", nil
	}
	return "", auth.ErrInvalidCredentials
}

func (b *testBackend) CheckSender(_ context.Context, user string, from mail.Address) error {
	if n := from.Normalized(); n == user || user == "alice@example.org" && n == "a.liddell@example.org" {
		return nil
	}
	return delivery.ErrSenderNotAllowed
}

func (b *testBackend) Resolve(_ context.Context, rcpt mail.Address, opts delivery.ResolveOptions) (delivery.Recipient, error) {
	switch d := rcpt.DomainNormalized(); {
	case d == "example.org" || d == "mx.example.org":
	case opts.Authenticated:
		return delivery.Recipient{}, delivery.ErrOutboundDisabled
	default:
		return delivery.Recipient{}, delivery.ErrRelayDenied
	}
	local := strings.ToLower(rcpt.Local)
	switch local {
	case "full":
		return delivery.Recipient{}, delivery.ErrMailboxFull
	case "quota":
		return delivery.Recipient{}, delivery.ErrOverQuota
	case "disabled":
		return delivery.Recipient{}, delivery.ErrDisabled
	case "tempfail":
		return delivery.Recipient{}, errors.New("database timeout")
	case "alice", "bob", "carol", "postmaster", "late-quota", "late-temp", "δοκιμή":
		return delivery.Recipient{Address: rcpt, User: local + "@example.org"}, nil
	}
	return delivery.Recipient{}, delivery.ErrNoSuchUser
}

func (b *testBackend) Deliver(_ context.Context, m delivery.Message) ([]error, error) {
	if b.discard {
		if _, err := io.Copy(io.Discard, m.Body); err != nil {
			return nil, fmt.Errorf("read body: %w", err)
		}
		return make([]error, len(m.Recipients)), nil
	}
	body, err := io.ReadAll(m.Body)
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if bytes.Contains(body, []byte("X-Test-Storage-Fail")) {
		return nil, errors.New("blob store unavailable")
	}
	results := make([]error, len(m.Recipients))
	var ok []delivery.Recipient
	for i, r := range m.Recipients {
		switch r.User {
		case "late-quota@example.org":
			results[i] = delivery.ErrOverQuota
		case "late-temp@example.org":
			results[i] = errors.New("append failed")
		default:
			ok = append(ok, r)
		}
	}
	if len(ok) > 0 {
		b.mu.Lock()
		b.messages = append(b.messages, testMessage{from: m.ReturnPath, rcpts: ok, body: body})
		b.mu.Unlock()
	}
	return results, nil
}

func (b *testBackend) delivered() []testMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]testMessage(nil), b.messages...)
}
