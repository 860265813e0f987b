package auth

import (
	"context"
	"errors"
	"fmt"

	"quill/internal/mail"
	"quill/internal/store"
)

// DirectoryStore is what user administration needs from the store.
type DirectoryStore interface {
	CreateUser(ctx context.Context, u store.User) error
	GetUser(ctx context.Context, address string) (store.User, error)
	UpdateUser(ctx context.Context, u store.User) error
	DeleteUser(ctx context.Context, address string) error
	ListUsers(ctx context.Context, after string, limit int) ([]store.User, error)
	CreateAlias(ctx context.Context, alias, target string) error
	DeleteAlias(ctx context.Context, alias string) error
	ListAliases(ctx context.Context) ([][2]string, error)
	CreateMailbox(ctx context.Context, user, name string, opts store.MailboxOptions) (store.Mailbox, error)
}

// DefaultMailboxes are created for every new user beside INBOX, with their
// RFC 6154 special-use attributes, so that every client finds the same
// folders.
var DefaultMailboxes = []struct{ Name, SpecialUse string }{
	{"Archive", `\Archive`},
	{"Drafts", `\Drafts`},
	{"Junk", `\Junk`},
	{"Sent", `\Sent`},
	{"Trash", `\Trash`},
}

// Directory administers users and aliases: the operations behind
// `quill user` and `quill alias` and the admin API.
type Directory struct {
	Store DirectoryStore
	KDF   KDFParams
}

// ErrWeakPassword is returned for a password too short to be worth storing.
var ErrWeakPassword = errors.New("auth: password must be at least 8 characters")

// NormalizeAddress parses an address as given by an administrator and
// returns its normalized form.
func NormalizeAddress(s string) (string, error) {
	a, err := mail.ParseAddress(s, true)
	if err != nil {
		return "", err
	}
	return a.Normalized(), nil
}

func (d *Directory) kdf() KDFParams {
	if d.KDF == (KDFParams{}) {
		return DefaultKDF
	}
	return d.KDF
}

// AddUser creates a user with its default mailboxes.
func (d *Directory) AddUser(ctx context.Context, address, password string, quotaBytes int64) error {
	addr, err := NormalizeAddress(address)
	if err != nil {
		return err
	}
	if len(password) < 8 {
		return ErrWeakPassword
	}
	hash, err := HashPassword(password, d.kdf())
	if err != nil {
		return err
	}
	if err := d.Store.CreateUser(ctx, store.User{Address: addr, PasswordHash: hash, QuotaBytes: quotaBytes}); err != nil {
		return err
	}
	for _, m := range DefaultMailboxes {
		_, err := d.Store.CreateMailbox(ctx, addr, m.Name, store.MailboxOptions{SpecialUse: m.SpecialUse, Subscribed: true})
		if err != nil && !errors.Is(err, store.ErrExists) {
			return fmt.Errorf("creating %s for %s: %w", m.Name, addr, err)
		}
	}
	return nil
}

// SetPassword replaces a user's password.
func (d *Directory) SetPassword(ctx context.Context, address, password string) error {
	addr, err := NormalizeAddress(address)
	if err != nil {
		return err
	}
	if len(password) < 8 {
		return ErrWeakPassword
	}
	u, err := d.Store.GetUser(ctx, addr)
	if err != nil {
		return err
	}
	if u.PasswordHash, err = HashPassword(password, d.kdf()); err != nil {
		return err
	}
	return d.Store.UpdateUser(ctx, u)
}

// SetQuota sets a user's quota in bytes (0: unlimited).
func (d *Directory) SetQuota(ctx context.Context, address string, quotaBytes int64) error {
	addr, err := NormalizeAddress(address)
	if err != nil {
		return err
	}
	u, err := d.Store.GetUser(ctx, addr)
	if err != nil {
		return err
	}
	u.QuotaBytes = quotaBytes
	return d.Store.UpdateUser(ctx, u)
}

// DeleteUser deletes a user with all its mail and aliases.
func (d *Directory) DeleteUser(ctx context.Context, address string) error {
	addr, err := NormalizeAddress(address)
	if err != nil {
		return err
	}
	return d.Store.DeleteUser(ctx, addr)
}

// ListUsers returns every user, ascending.
func (d *Directory) ListUsers(ctx context.Context) ([]store.User, error) {
	var all []store.User
	after := ""
	for {
		page, err := d.Store.ListUsers(ctx, after, 1000)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < 1000 {
			return all, nil
		}
		after = page[len(page)-1].Address
	}
}

// AddAlias makes alias deliver to target.
func (d *Directory) AddAlias(ctx context.Context, alias, target string) error {
	a, err := NormalizeAddress(alias)
	if err != nil {
		return err
	}
	t, err := NormalizeAddress(target)
	if err != nil {
		return err
	}
	return d.Store.CreateAlias(ctx, a, t)
}

// DeleteAlias removes an alias.
func (d *Directory) DeleteAlias(ctx context.Context, alias string) error {
	a, err := NormalizeAddress(alias)
	if err != nil {
		return err
	}
	return d.Store.DeleteAlias(ctx, a)
}

// ListAliases returns every alias and its target.
func (d *Directory) ListAliases(ctx context.Context) ([][2]string, error) {
	return d.Store.ListAliases(ctx)
}
