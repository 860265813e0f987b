package mailbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"quill/internal/store"
)

// Errors of the IMAP mailbox operations, classified for the protocol edge
// (errors.Is). The store's error is wrapped beside them.
var (
	ErrNoSuchMailbox = errors.New("mailbox: no such mailbox")
	ErrMailboxExists = errors.New("mailbox: mailbox already exists")
	// ErrBadName: the name is not acceptable (empty, malformed, INBOX
	// where INBOX may not be used).
	ErrBadName = errors.New("mailbox: invalid mailbox name")
	// ErrOverQuota: the user's quota does not allow the change.
	ErrOverQuota = errors.New("mailbox: over quota")
	// ErrTooBig: a message exceeds the size limit.
	ErrTooBig = errors.New("mailbox: message too big")
	// ErrInvalid: a flag or another argument the store refuses.
	ErrInvalid = errors.New("mailbox: invalid argument")
	// ErrExpunged: the message was expunged by another session.
	ErrExpunged = errors.New("mailbox: message expunged")
	// ErrReadOnly: the mailbox was opened read-only (EXAMINE).
	ErrReadOnly = errors.New("mailbox: mailbox is read-only")
)

// classify wraps a store error with the mailbox error that describes it,
// keeping the store error in the chain.
func classify(err error, what string) error {
	var kind error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrOutcomeUnknown):
		// Whatever else it wraps, the write may have been applied.
		return fmt.Errorf("mailbox: %s: %w", what, err)
	case errors.Is(err, store.ErrNotFound):
		kind = ErrNoSuchMailbox
	case errors.Is(err, store.ErrExists):
		kind = ErrMailboxExists
	case errors.Is(err, store.ErrOverQuota):
		kind = ErrOverQuota
	case errors.Is(err, store.ErrInvalid):
		kind = ErrInvalid
	default:
		return fmt.Errorf("mailbox: %s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", kind, what, err)
}

// IMAPStore is what IMAP mailbox semantics need from the store.
type IMAPStore interface {
	GetMailbox(ctx context.Context, user, name string) (store.Mailbox, error)
	GetMailboxByID(ctx context.Context, id store.ID) (store.Mailbox, error)
	ListMailboxes(ctx context.Context, user string) ([]store.Mailbox, error)
	CreateMailbox(ctx context.Context, user, name string, opts store.MailboxOptions) (store.Mailbox, error)
	RenameMailbox(ctx context.Context, user, from, to string) error
	DeleteMailbox(ctx context.Context, user, name string) error
	SetSubscribed(ctx context.Context, user, name string, subscribed bool) error
	PutBlob(ctx context.Context, r io.Reader, maxSize int64) (store.ID, int64, error)
	OpenBlob(ctx context.Context, id store.ID) (store.BlobReader, error)
	Append(ctx context.Context, mailbox store.ID, msgs []store.NewMessage, opts store.AppendOptions) ([]store.Message, error)
	ListMessages(ctx context.Context, mailbox store.ID, from uint32, limit int) ([]store.Message, error)
	GetMessage(ctx context.Context, mailbox store.ID, uid uint32) (store.Message, error)
	SetFlags(ctx context.Context, mailbox store.ID, change store.FlagChange) (store.FlagResult, error)
	Expunge(ctx context.Context, mailbox store.ID, uids []uint32) ([]uint32, uint64, error)
	// Move moves messages between two mailboxes of one user, atomically
	// where the user manager can (usermgr.Manager.Move).
	Move(ctx context.Context, from store.ID, uids []uint32, to store.ID) (src, dst []uint32, err error)
	Changes(ctx context.Context, mailbox store.ID, since uint64, limit int) ([]store.Change, error)
	GetUser(ctx context.Context, address string) (store.User, error)
	Usage(ctx context.Context, user string) (store.Usage, error)
}

// Delimiter is the hierarchy delimiter of mailbox names (RFC 3501
// section 5.1.1).
const Delimiter = "/"

// pageSize is how many messages or changes one store call returns.
const pageSize = 1000

// Mailboxes gives IMAP sessions their users' mailboxes. It is safe for
// concurrent use.
type Mailboxes struct {
	st  IMAPStore
	hub *Hub
}

// NewMailboxes returns the IMAP mailbox service over st, whose writes the
// user manager (internal/usermgr) orders and announces on hub; views
// selected through it listen there.
func NewMailboxes(st IMAPStore, hub *Hub) *Mailboxes {
	return &Mailboxes{st: st, hub: hub}
}

// User returns the mailbox operations of an authenticated user.
func (m *Mailboxes) User(user string) *User { return &User{m: m, user: user} }

// User is one user's mailboxes, as an authenticated IMAP session sees them.
type User struct {
	m    *Mailboxes
	user string
}

// Info is a mailbox's state, for LIST and STATUS.
type Info struct {
	Name          string
	SpecialUse    string
	Subscribed    bool
	UIDValidity   uint32
	UIDNext       uint32
	HighestModSeq uint64
	Messages      uint32
	Size          int64
}

func infoOf(mb store.Mailbox) Info {
	return Info{Name: mb.Name, SpecialUse: mb.SpecialUse, Subscribed: mb.Subscribed, UIDValidity: mb.UIDValidity,
		UIDNext: mb.UIDNext, HighestModSeq: mb.HighestModSeq, Messages: mb.Messages, Size: mb.Size}
}

// CanonicalName returns name with INBOX (and an INBOX/ prefix) in upper
// case: INBOX is case-insensitive (RFC 3501 section 5.1), other names are
// not. A trailing delimiter is dropped (RFC 3501 section 6.3.3).
func CanonicalName(name string) string {
	name = strings.TrimSuffix(name, Delimiter)
	first, rest, hasRest := strings.Cut(name, Delimiter)
	if strings.EqualFold(first, "INBOX") {
		if hasRest {
			return "INBOX" + Delimiter + rest
		}
		return "INBOX"
	}
	return name
}

// List returns every mailbox of the user, ordered by name.
func (u *User) List(ctx context.Context) ([]Info, error) {
	mbs, err := u.m.st.ListMailboxes(ctx, u.user)
	if err != nil {
		return nil, classify(err, "list")
	}
	out := make([]Info, len(mbs))
	for i, mb := range mbs {
		out[i] = infoOf(mb)
	}
	return out, nil
}

// Counts are the STATUS counters that need every message's flags.
type Counts struct {
	Unseen  uint32 // messages without \Seen
	Deleted uint32 // messages with \Deleted (RFC 9051 STATUS DELETED)
	// DeletedSize is the octets of the messages with \Deleted (RFC 9208
	// STATUS DELETED-STORAGE).
	DeletedSize int64
}

// Status returns a mailbox's counters; with count it also counts flags,
// which reads every message's flags.
func (u *User) Status(ctx context.Context, name string, count bool) (Info, Counts, error) {
	mb, err := u.m.st.GetMailbox(ctx, u.user, CanonicalName(name))
	if err != nil {
		return Info{}, Counts{}, classify(err, name)
	}
	var n Counts
	if count {
		err := u.scan(ctx, mb.ID, func(m store.Message) {
			if !hasFlag(m.Flags, store.FlagSeen) {
				n.Unseen++
			}
			if hasFlag(m.Flags, store.FlagDeleted) {
				n.Deleted++
				n.DeletedSize += m.Size
			}
		})
		if err != nil {
			return Info{}, Counts{}, err
		}
	}
	return infoOf(mb), n, nil
}

func (u *User) scan(ctx context.Context, id store.ID, fn func(store.Message)) error {
	var from uint32 = 1
	for {
		page, err := u.m.st.ListMessages(ctx, id, from, pageSize)
		if err != nil {
			return classify(err, "list messages")
		}
		for _, m := range page {
			fn(m)
		}
		if len(page) < pageSize {
			return nil
		}
		from = page[len(page)-1].UID + 1
	}
}

func hasFlag(flags []string, f string) bool {
	for _, x := range flags {
		if x == f {
			return true
		}
	}
	return false
}

// Create creates a mailbox and any missing superior (RFC 3501 section
// 6.3.3), with an RFC 6154 special-use attribute or "".
func (u *User) Create(ctx context.Context, name, specialUse string) error {
	name = CanonicalName(name)
	if name == "INBOX" {
		return fmt.Errorf("%w: INBOX always exists", ErrMailboxExists)
	}
	if name == "" || strings.HasPrefix(name, Delimiter) || strings.Contains(name, Delimiter+Delimiter) ||
		strings.ContainsAny(name, "*%") {
		return fmt.Errorf("%w: %q", ErrBadName, name)
	}
	parts := strings.Split(name, Delimiter)
	for i := 1; i < len(parts); i++ {
		parent := strings.Join(parts[:i], Delimiter)
		if parent == "INBOX" {
			continue
		}
		_, err := u.m.st.CreateMailbox(ctx, u.user, parent, store.MailboxOptions{})
		if err != nil && !errors.Is(err, store.ErrExists) {
			return classify(err, parent)
		}
	}
	_, err := u.m.st.CreateMailbox(ctx, u.user, name, store.MailboxOptions{SpecialUse: specialUse})
	return classify(err, name)
}

// Delete deletes a mailbox and its messages; its inferiors stay (RFC 3501
// section 6.3.4). INBOX cannot be deleted.
func (u *User) Delete(ctx context.Context, name string) error {
	name = CanonicalName(name)
	if name == "INBOX" {
		return fmt.Errorf("%w: INBOX cannot be deleted", ErrBadName)
	}
	return classify(u.m.st.DeleteMailbox(ctx, u.user, name), name)
}

// Rename renames a mailbox and its inferiors (RFC 3501 section 6.3.5).
// Renaming INBOX moves all its messages to a new mailbox and leaves INBOX
// empty, pageSize messages at a time, each page atomically: a failure
// part-way leaves the pages moved so far in the new mailbox and the rest
// in INBOX, each message in exactly one of them.
func (u *User) Rename(ctx context.Context, from, to string) error {
	from, to = CanonicalName(from), CanonicalName(to)
	if to == "INBOX" {
		return fmt.Errorf("%w: cannot rename to INBOX", ErrMailboxExists)
	}
	if from != "INBOX" {
		if err := u.createParents(ctx, to); err != nil {
			return err
		}
		return classify(u.m.st.RenameMailbox(ctx, u.user, from, to), from)
	}
	inbox, err := u.m.st.GetMailbox(ctx, u.user, "INBOX")
	if err != nil {
		return classify(err, "INBOX")
	}
	if err := u.Create(ctx, to, ""); err != nil {
		return err
	}
	dest, err := u.m.st.GetMailbox(ctx, u.user, to)
	if err != nil {
		return classify(err, to)
	}
	for {
		page, err := u.m.st.ListMessages(ctx, inbox.ID, 1, pageSize)
		if err != nil {
			return classify(err, "INBOX")
		}
		if len(page) == 0 {
			return nil
		}
		if _, _, err := u.m.st.Move(ctx, inbox.ID, uidsOf(page), dest.ID); err != nil {
			return classify(err, to)
		}
	}
}

func (u *User) createParents(ctx context.Context, name string) error {
	parts := strings.Split(name, Delimiter)
	for i := 1; i < len(parts); i++ {
		parent := strings.Join(parts[:i], Delimiter)
		if parent == "INBOX" {
			continue
		}
		if _, err := u.m.st.CreateMailbox(ctx, u.user, parent, store.MailboxOptions{}); err != nil && !errors.Is(err, store.ErrExists) {
			return classify(err, parent)
		}
	}
	return nil
}

func newMessages(msgs []store.Message) []store.NewMessage {
	out := make([]store.NewMessage, len(msgs))
	for i, m := range msgs {
		out[i] = store.NewMessage{Blob: m.Blob, Size: m.Size, Flags: m.Flags, InternalDate: m.InternalDate, Meta: m.Meta}
	}
	return out
}

func uidsOf(msgs []store.Message) []uint32 {
	out := make([]uint32, len(msgs))
	for i, m := range msgs {
		out[i] = m.UID
	}
	return out
}

// SetSubscribed subscribes or unsubscribes a mailbox (RFC 3501 sections
// 6.3.6 and 6.3.7).
func (u *User) SetSubscribed(ctx context.Context, name string, on bool) error {
	name = CanonicalName(name)
	return classify(u.m.st.SetSubscribed(ctx, u.user, name, on), name)
}

// Body is a message body ready to be appended: stored already, or held in
// memory to be written with the Append that uses it.
type Body struct {
	id     store.ID
	inline []byte
	size   int64
}

// Size is the body's size in octets.
func (b Body) Size() int64 { return b.size }

// InlineBodyMax is the largest body PutBody holds in memory rather than
// storing it first: as much as the store's own chunk buffer holds while it
// stores a body, and the bound delivery uses for the same purpose.
const InlineBodyMax = 256 << 10

// PutBody prepares a message body read from r, which must yield exactly
// size octets (an APPEND literal). With inline true and size at most
// InlineBodyMax the body is held in memory and written with the Append that
// uses it, in the same store write (store.NewMessage.Body): the APPEND then
// costs one commit, one fsync, instead of two. Otherwise it is stored now,
// and reclaimed by the store if never appended.
func (u *User) PutBody(ctx context.Context, r io.Reader, size int64, inline bool) (Body, error) {
	if inline && size >= 0 && size <= InlineBodyMax {
		// One octet more than announced, to see the end: store.FillChunk
		// reads as PutBlob does, so only io.EOF ends a body.
		buf := make([]byte, size+1)
		n, eof, err := store.FillChunk(r, buf)
		switch {
		case err != nil:
			return Body{}, fmt.Errorf("mailbox: reading body: %w", err)
		case !eof:
			return Body{}, fmt.Errorf("%w: body longer than the %d octets announced", ErrInvalid, size)
		case int64(n) != size:
			return Body{}, fmt.Errorf("%w: body of %d octets, %d announced", ErrInvalid, n, size)
		}
		return Body{inline: buf[:n:n], size: size}, nil
	}
	id, n, err := u.m.st.PutBlob(ctx, r, size)
	if err != nil {
		return Body{}, fmt.Errorf("mailbox: storing body: %w", err)
	}
	if n != size {
		return Body{}, fmt.Errorf("%w: body of %d octets, %d announced", ErrInvalid, n, size)
	}
	return Body{id: id, size: n}, nil
}

// NewMessage is a message to append.
type NewMessage struct {
	Body  Body
	Flags []string
	Date  time.Time
	// Meta is the message summary computed by the layer above, stored
	// opaquely (store.Message.Meta); nil if none.
	Meta []byte
}

// AppendResult reports where messages were appended (RFC 4315 APPENDUID).
type AppendResult struct {
	UIDValidity uint32
	UIDs        []uint32
}

// Append appends msgs to a mailbox atomically (RFC 3502 MULTIAPPEND), with
// the user's quota checked.
func (u *User) Append(ctx context.Context, name string, msgs []NewMessage) (AppendResult, error) {
	name = CanonicalName(name)
	mb, err := u.m.st.GetMailbox(ctx, u.user, name)
	if err != nil {
		return AppendResult{}, classify(err, name)
	}
	nms := make([]store.NewMessage, len(msgs))
	for i, m := range msgs {
		nms[i] = store.NewMessage{Blob: m.Body.id, Body: m.Body.inline, Size: m.Body.size, Flags: m.Flags, InternalDate: m.Date, Meta: m.Meta}
	}
	stored, err := u.m.st.Append(ctx, mb.ID, nms, store.AppendOptions{CheckQuota: true})
	if err != nil {
		return AppendResult{}, classify(err, name)
	}
	return AppendResult{UIDValidity: mb.UIDValidity, UIDs: uidsOf(stored)}, nil
}

// Quota is a user's storage quota and usage over all mailboxes (RFC 9208
// section 5.1, the STORAGE resource; one quota root per user).
type Quota struct {
	Limit    int64 // octets; 0 means unlimited
	Used     int64 // octets
	Messages int64
}

// Quota returns the user's quota and current usage. The limit is set by
// the operator (store.User.QuotaBytes) and enforced by the store on every
// Append made with CheckQuota.
func (u *User) Quota(ctx context.Context) (Quota, error) {
	usr, err := u.m.st.GetUser(ctx, u.user)
	if err != nil {
		return Quota{}, fmt.Errorf("mailbox: quota of %s: %w", u.user, err)
	}
	use, err := u.m.st.Usage(ctx, u.user)
	if err != nil {
		return Quota{}, fmt.Errorf("mailbox: usage of %s: %w", u.user, err)
	}
	return Quota{Limit: usr.QuotaBytes, Used: use.Bytes, Messages: use.Messages}, nil
}
