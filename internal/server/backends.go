package server

import (
	"context"
	"io"

	"quill/internal/auth"
	"quill/internal/delivery"
	"quill/internal/mailbox"
	"quill/internal/pop3"
	"quill/internal/smtp"
)

// smtpBackend joins authentication and delivery into what the SMTP front
// end needs.
type smtpBackend struct {
	*auth.Authenticator
	*delivery.Agent
}

var _ smtp.Backend = smtpBackend{}

// pop3Backend joins authentication and maildrops into what the POP3 front
// end needs.
type pop3Backend struct {
	*auth.Authenticator
	mailboxes *mailbox.Service
}

var _ pop3.Backend = pop3Backend{}

func (b pop3Backend) OpenMaildrop(ctx context.Context, user string) (pop3.Maildrop, error) {
	m, err := b.mailboxes.OpenMaildrop(ctx, user)
	if err != nil {
		return nil, err
	}
	msgs := make([]pop3.Message, m.Len())
	for i := range msgs {
		msgs[i] = pop3.Message{UID: m.UniqueID(i), Size: m.Size(i)}
	}
	return maildrop{m: m, msgs: msgs}, nil
}

type maildrop struct {
	m    *mailbox.Maildrop
	msgs []pop3.Message
}

func (d maildrop) Messages() []pop3.Message { return d.msgs }

func (d maildrop) Retrieve(ctx context.Context, i int) (io.ReadCloser, error) {
	return d.m.Open(ctx, i)
}

func (d maildrop) Commit(ctx context.Context, deleted []int) error { return d.m.Commit(ctx, deleted) }

func (d maildrop) Close() error { return d.m.Close() }
