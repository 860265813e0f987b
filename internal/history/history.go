// Package history records what the clients of a mail cluster did and saw,
// as operations with invocation and completion times, and checks the
// record after the run (Check) against the guarantees Quill gives a
// client, in the manner of Jepsen and etcd's robustness tests:
//
//   - no acknowledged message is lost or duplicated, and every body is
//     byte-exact (a checksum of a body unique to one operation);
//   - per client, UIDs in a mailbox increase strictly in the order
//     observed, and no UID is used for two messages under one UIDVALIDITY;
//   - per client, MODSEQ never decreases;
//   - no acknowledged flag change is lost;
//   - an acknowledged EXPUNGE or POP3 DELE+QUIT removed its messages, and
//     an acknowledged MOVE left them in the destination, not the source.
//
// An operation ends Ok (acknowledged), Failed (definitely not applied) or
// Ambiguous (it may or may not have been applied, at any time after its
// invocation, but at most once: a timeout, a connection cut after the
// request was sent). The checker treats an Ambiguous operation as
// concurrent with everything invoked after it.
//
// Messages are identified by a token unique to the operation that wrote
// them (Deliver or Append); a delivery to several recipients makes one
// message per recipient, each identified by (user, token). A message moves
// between one user's mailboxes only by MOVE, so the checker follows it by
// token; its placements (mailbox, UIDVALIDITY, UID) are what clients see.
//
// The package is pure: the clients that fill in Ops live with the harness
// (e2e/robust_*_test.go) and talk to real servers.
package history

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Time is a point in a run: nanoseconds since the Recorder started. Times
// of one history are comparable; they carry no wall-clock meaning.
type Time int64

// Outcome is how an operation ended, as its client knows it.
type Outcome uint8

const (
	// Ok: the server acknowledged the operation (250, tagged OK, +OK).
	Ok Outcome = iota + 1
	// Failed: the operation was definitely not applied (a refusal, or a
	// failure before the request was complete).
	Failed
	// Ambiguous: the request was sent and no answer came in time; it may
	// have been applied, then or later, at most once.
	Ambiguous
)

var outcomeNames = map[Outcome]string{Ok: "ok", Failed: "failed", Ambiguous: "ambiguous"}

func (o Outcome) String() string {
	if s, ok := outcomeNames[o]; ok {
		return s
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// MarshalText writes the outcome's name.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads an outcome's name.
func (o *Outcome) UnmarshalText(b []byte) error {
	for k, v := range outcomeNames {
		if v == string(b) {
			*o = k
			return nil
		}
	}
	return fmt.Errorf("history: unknown outcome %q", b)
}

// Kind is what an operation did.
type Kind uint8

const (
	// Deliver is an SMTP or LMTP transaction of one new message (Token,
	// Sum) to Rcpts, each with its own outcome (LMTP replies per
	// recipient; SMTP refuses a recipient at RCPT).
	Deliver Kind = iota + 1
	// Append is an IMAP APPEND of one new message to Mailbox; Rcpts holds
	// Mailbox's user with the operation's outcome.
	Append
	// Store is an IMAP UID STORE (with CONDSTORE's UNCHANGEDSINCE) that
	// adds (Add) or removes one Flag on the messages in Targets. A
	// [MODIFIED] refusal is Failed.
	Store
	// Expunge is an IMAP UID STORE +FLAGS (\Deleted) and UID EXPUNGE of
	// Targets in Mailbox.
	Expunge
	// Move is an IMAP UID MOVE of Targets from Mailbox to Dest (a mailbox
	// of the same user); Moved is the server's COPYUID.
	Move
	// Idle is an IMAP IDLE on Mailbox followed by a listing: a read.
	Idle
	// Read is an IMAP SELECT of Mailbox and a FETCH of every message: a
	// read. Final marks the reads of the final state.
	Read
	// Dele is a POP3 session on a user's INBOX (Mailbox) that marked
	// Targets (by token; POP3 shows no IMAP UIDs) with DELE and ended in
	// QUIT: Ok means the QUIT's +OK.
	Dele
)

var kindNames = map[Kind]string{Deliver: "deliver", Append: "append", Store: "store", Expunge: "expunge",
	Move: "move", Idle: "idle", Read: "read", Dele: "dele"}

// Kinds lists every kind, in the order reports use.
var Kinds = []Kind{Deliver, Append, Store, Expunge, Move, Idle, Read, Dele}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// MarshalText writes the kind's name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind's name.
func (k *Kind) UnmarshalText(b []byte) error {
	for id, v := range kindNames {
		if v == string(b) {
			*k = id
			return nil
		}
	}
	return fmt.Errorf("history: unknown kind %q", b)
}

// Sum is the SHA-256 of a message's content: as sent, and as read back
// without the trace fields a receiving server prepends.
type Sum [sha256.Size]byte

// SumOf returns the checksum of b.
func SumOf(b []byte) Sum { return sha256.Sum256(b) }

// MarshalText writes the sum in hex.
func (s Sum) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(s[:])), nil }

// UnmarshalText reads a sum in hex.
func (s *Sum) UnmarshalText(b []byte) error {
	if hex.DecodedLen(len(b)) != len(s) {
		return fmt.Errorf("history: sum %q is not %d bytes of hex", b, len(s))
	}
	_, err := hex.Decode(s[:], b)
	return err
}

func (s Sum) String() string { return hex.EncodeToString(s[:6]) }

// Mailbox names one mailbox of one user.
type Mailbox struct {
	User string `json:"user"`
	Name string `json:"name"`
}

func (m Mailbox) String() string { return m.User + "/" + m.Name }

// Rcpt is one recipient of a Deliver (or the user of an Append) and its
// outcome.
type Rcpt struct {
	User    string  `json:"user"`
	Outcome Outcome `json:"outcome"`
}

// Target is a message an operation acted on: its token, and its UID in the
// operation's Mailbox as the client last saw it (0 for POP3).
type Target struct {
	Token string `json:"token"`
	UID   uint32 `json:"uid,omitempty"`
}

// UIDPair is one entry of COPYUID (RFC 4315): the message with UID From in
// the source is UID To in the destination.
type UIDPair struct {
	From uint32 `json:"from"`
	To   uint32 `json:"to"`
}

// Seen is one message as an operation observed it.
type Seen struct {
	UID uint32 `json:"uid"`
	// Token identifies the message, as read from the server (its header
	// or its body); "" when neither was fetched (a STORE's FETCH
	// response). Sum is the checksum of the body read back, valid when
	// HasBody.
	Token   string `json:"token,omitempty"`
	Sum     Sum    `json:"sum"`
	HasBody bool   `json:"has_body,omitempty"`
	// Flags as fetched; HasFlags is false when they were not.
	Flags    []string `json:"flags,omitempty"`
	HasFlags bool     `json:"has_flags,omitempty"`
	// ModSeq is the message's MODSEQ (RFC 7162), 0 when not fetched.
	ModSeq uint64 `json:"modseq,omitempty"`
}

// View is what one operation observed of one mailbox.
type View struct {
	UIDValidity uint32 `json:"uidvalidity"`
	// HighestModSeq is SELECT's or STATUS's HIGHESTMODSEQ; 0 when none
	// was reported.
	HighestModSeq uint64 `json:"highestmodseq,omitempty"`
	// Complete: Messages is every message of the mailbox at one instant,
	// in mailbox (sequence number) order.
	Complete bool   `json:"complete,omitempty"`
	Messages []Seen `json:"messages,omitempty"`
}

// Op is one operation of one client (a process: it runs one operation at
// a time). A client owns its Op from Recorder.Begin to Recorder.End.
type Op struct {
	Index   int    `json:"index"`
	Process int    `json:"process"`
	Node    string `json:"node,omitempty"` // which server it talked to
	Kind    Kind   `json:"kind"`
	// Invoke is when the client began; Complete when it knew the outcome
	// (for Ambiguous, when it gave up waiting).
	Invoke   Time    `json:"invoke"`
	Complete Time    `json:"complete"`
	Outcome  Outcome `json:"outcome"`
	Error    string  `json:"error,omitempty"`

	// Mailbox is the mailbox acted on or read (not set for Deliver).
	Mailbox Mailbox `json:"mailbox"`

	// Token and Sum describe the new message of a Deliver or Append.
	Token string `json:"token,omitempty"`
	Sum   Sum    `json:"sum"`
	Rcpts []Rcpt `json:"rcpts,omitempty"`
	// AppendUID is an Ok Append's APPENDUID (RFC 4315), 0 if none.
	AppendUID      uint32 `json:"append_uid,omitempty"`
	AppendValidity uint32 `json:"append_validity,omitempty"`

	// Targets are the messages a Store, Expunge, Move or Dele acted on.
	Targets []Target `json:"targets,omitempty"`
	// Flag and Add describe a Store.
	Flag string `json:"flag,omitempty"`
	Add  bool   `json:"add,omitempty"`
	// Dest, Moved and DestValidity describe a Move: the destination
	// mailbox's name and the server's COPYUID.
	Dest         string    `json:"dest,omitempty"`
	Moved        []UIDPair `json:"moved,omitempty"`
	DestValidity uint32    `json:"dest_validity,omitempty"`

	// View is what the operation observed of Mailbox, if anything
	// (a Read's or Idle's listing, a Store's FETCH responses, the listing
	// an Expunge or Move chose its targets from).
	View *View `json:"view,omitempty"`
	// Final marks a Read of the final state, after the run quiesced.
	Final bool `json:"final,omitempty"`
}

// Recorder collects the operations of a run from many goroutines.
type Recorder struct {
	start time.Time
	mu    struct {
		sync.Mutex
		ops    []*Op
		ended  int
		acked  int
		notify chan struct{} // closed and replaced when an operation ends
	}
}

// NewRecorder returns a Recorder whose Time 0 is now.
func NewRecorder() *Recorder {
	r := &Recorder{start: time.Now()}
	r.mu.notify = make(chan struct{})
	return r
}

// Now returns the current Time of the run.
func (r *Recorder) Now() Time { return Time(time.Since(r.start)) }

// Begin records the invocation of an operation and returns it for the
// client to fill in and End.
func (r *Recorder) Begin(process int, node string, kind Kind) *Op {
	op := &Op{Process: process, Node: node, Kind: kind}
	r.mu.Lock()
	defer r.mu.Unlock()
	op.Index = len(r.mu.ops)
	op.Invoke = r.Now()
	r.mu.ops = append(r.mu.ops, op)
	return op
}

// End records op's completion. err, when not nil, is kept as text.
func (r *Recorder) End(op *Op, outcome Outcome, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.Complete = r.Now()
	op.Outcome = outcome
	if err != nil {
		op.Error = err.Error()
	}
	r.mu.ended++
	if outcome == Ok && op.Kind != Read && op.Kind != Idle {
		r.mu.acked++
	}
	close(r.mu.notify)
	r.mu.notify = make(chan struct{})
}

// Acked returns how many writes (every kind but Read and Idle) ended Ok.
func (r *Recorder) Acked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.acked
}

// ErrStalled is returned by WaitAcked when the count is not reached in time.
var ErrStalled = errors.New("history: progress stalled")

// WaitAcked waits until n writes have ended Ok, ctx ends or timeout
// passes (ErrStalled).
func (r *Recorder) WaitAcked(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		got, ch := r.mu.acked, r.mu.notify
		r.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("%w: %d of %d writes acknowledged within %v", ErrStalled, got, n, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Ops returns a copy of every operation begun so far. An operation that
// has not ended (its client is still waiting) is returned as Ambiguous.
// Call it after the clients have stopped for a history to Check.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Op, len(r.mu.ops))
	for i, op := range r.mu.ops {
		out[i] = *op
		if out[i].Outcome == 0 {
			out[i].Outcome = Ambiguous
			out[i].Complete = r.Now()
		}
	}
	return out
}
