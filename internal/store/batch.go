package store

import (
	"context"
	"fmt"
)

// Batch is one ordered write of a user's mailbox records, built by the
// user's manager (internal/usermgr, ADR 0023): the manager has assigned
// every UID and MODSEQ, checked the quota and read the current state of
// every record the batch rewrites. An engine applies a batch atomically
// and durably; it assigns nothing and decides nothing, but it checks the
// batch's assertions (each rewritten or removed message is still at the
// MODSEQ the manager read, no head moves backwards) and refuses a batch
// that fails one with ErrConflict, writing nothing.
//
// One batch may touch several mailboxes of its user: a MOVE is the
// destination's additions and the source's expunge in one batch, so no
// reader ever sees the message in both mailboxes or in neither.
type Batch struct {
	User string
	// Epoch is the fencing epoch under which the writer manages User's
	// bucket (ADR 0024). An engine shared by several nodes stamps the
	// batch's writes with it, so that every write of a later epoch
	// outranks them; the embedded engine, which one process opens,
	// ignores it.
	Epoch uint64
	// Heads moves mailbox heads forward and adjusts their counts. Every
	// mailbox the batch adds to, flags in or expunges from has one entry.
	Heads []HeadChange
	// Added are new messages, each recorded in its mailbox's change log
	// as added at its ModSeq. The messages of one mailbox are listed in
	// ascending UID order, and their MODSEQs do not decrease: with the
	// heads moving forward, a mailbox's added MODSEQs then never decrease
	// as its UIDs increase, which an engine may rely on to find the
	// messages added after a MODSEQ by their UIDs (the Cassandra engine
	// keeps no change log entry for an addition).
	Added []AddedMessage
	// Flagged rewrites the flags of existing messages; each message's
	// change log entry moves from PrevModSeq to ModSeq.
	Flagged []FlagWrite
	// Expunged removes messages; their change log entries become expunge
	// entries at the ExpungeWrite's ModSeq, and each releases its blob.
	Expunged []ExpungeWrite
	// Usage is added to the user's quota usage.
	Usage Usage
}

// HeadChange is the new state of a mailbox head after a Batch.
type HeadChange struct {
	Mailbox ID
	// UIDNext and HighestModSeq are the head's new values; neither may be
	// below the stored one.
	UIDNext       uint32
	HighestModSeq uint64
	// Messages and Size are added to the head's counts.
	Messages int64
	Size     int64
}

// AddedMessage is a new message of a Batch: Message is complete (UID,
// ModSeq, normalized flags). With Body non-nil the engine stores Body as a
// new blob with ID Message.Blob referenced by this message alone, written
// with the batch; otherwise Message.Blob, stored before by PutBlob, gains
// a reference.
type AddedMessage struct {
	Mailbox ID
	Message Message
	Body    []byte
	// FreshBlob is the NewMessage's: Message.Blob needs no check that it
	// is not being released.
	FreshBlob bool
}

// FlagWrite replaces the flags of message UID, which is at PrevModSeq, and
// moves it to ModSeq.
type FlagWrite struct {
	Mailbox    ID
	UID        uint32
	PrevModSeq uint64
	ModSeq     uint64
	Flags      []string // normalized
}

// ExpungeWrite removes Messages (UID ascending, distinct) from Mailbox at
// ModSeq.
type ExpungeWrite struct {
	Mailbox  ID
	ModSeq   uint64
	Messages []ExpungedMessage
}

// ExpungedMessage is one message an ExpungeWrite removes: its UID, the
// ModSeq it is at (its change log entry) and the blob it releases.
type ExpungedMessage struct {
	UID    uint32
	ModSeq uint64
	Blob   ID
}

// Validate reports, as ErrInvalid, a Batch no manager should build: a
// write to a mailbox without a head change, a message beyond its head's
// UIDNext or MODSEQ, additions to a mailbox out of order, an inline body of
// the wrong size. Engines call it before applying a batch.
func (b *Batch) Validate() error {
	heads := make(map[ID]HeadChange, len(b.Heads))
	for _, h := range b.Heads {
		if _, dup := heads[h.Mailbox]; dup {
			return fmt.Errorf("%w: batch: two head changes for mailbox %s", ErrInvalid, h.Mailbox)
		}
		heads[h.Mailbox] = h
	}
	within := func(mb ID, uid uint32, modseq uint64) error {
		h, ok := heads[mb]
		switch {
		case !ok:
			return fmt.Errorf("%w: batch: write to mailbox %s without a head change", ErrInvalid, mb)
		case uid >= h.UIDNext || modseq > h.HighestModSeq || modseq == 0:
			return fmt.Errorf("%w: batch: UID %d MODSEQ %d beyond mailbox %s's head (%d, %d)", ErrInvalid, uid, modseq, mb, h.UIDNext, h.HighestModSeq)
		}
		return nil
	}
	type added struct {
		uid    uint32
		modseq uint64
	}
	last := map[ID]added{}
	for _, a := range b.Added {
		if err := within(a.Mailbox, a.Message.UID, a.Message.ModSeq); err != nil {
			return err
		}
		if p, ok := last[a.Mailbox]; ok && (a.Message.UID <= p.uid || a.Message.ModSeq < p.modseq) {
			return fmt.Errorf("%w: batch: message %d (MODSEQ %d) added after message %d (MODSEQ %d)", ErrInvalid, a.Message.UID, a.Message.ModSeq, p.uid, p.modseq)
		}
		last[a.Mailbox] = added{a.Message.UID, a.Message.ModSeq}
		if a.Message.Blob.IsZero() || (a.Body != nil && int64(len(a.Body)) != a.Message.Size) {
			return fmt.Errorf("%w: batch: message %d without a blob or with a body of the wrong size", ErrInvalid, a.Message.UID)
		}
	}
	for _, f := range b.Flagged {
		if err := within(f.Mailbox, f.UID, f.ModSeq); err != nil {
			return err
		}
		if f.PrevModSeq >= f.ModSeq {
			return fmt.Errorf("%w: batch: flags of message %d moved from MODSEQ %d to %d", ErrInvalid, f.UID, f.PrevModSeq, f.ModSeq)
		}
	}
	for _, x := range b.Expunged {
		for i, m := range x.Messages {
			if err := within(x.Mailbox, m.UID, x.ModSeq); err != nil {
				return err
			}
			if m.ModSeq >= x.ModSeq || (i > 0 && m.UID <= x.Messages[i-1].UID) {
				return fmt.Errorf("%w: batch: expunge of message %d out of order", ErrInvalid, m.UID)
			}
		}
	}
	return nil
}

// BatchWriter is implemented by an engine that applies user managers'
// batches (ADR 0023).
type BatchWriter interface {
	// SubmitBatch queues b and returns a function that waits for its
	// outcome: nil once b is durable and visible to every reader, the
	// error that made the engine write none of it, or an error wrapping
	// ErrOutcomeUnknown when the engine cannot tell whether b was (or
	// will be) applied. Batches are applied in
	// the order their SubmitBatch calls returned, so a manager that submits
	// a user's batches one after another, under its lock, gets them
	// applied in that order while it waits for each outside the lock
	// (group commit). A batch refused for a failed assertion
	// (ErrConflict) or for lack of space (ErrUnavailable) does not stop
	// the ones after it. SubmitBatch fails only when the batch was not
	// queued. The wait function must be called once; b must not be
	// modified until it returns.
	SubmitBatch(ctx context.Context, b *Batch) (wait func() error, err error)
}

// Adopter is implemented by an engine shared by several nodes, whose
// mailbox writes are fenced by epoch (ADR 0024).
type Adopter interface {
	// AdoptMailbox makes epoch the writer epoch of mailbox before its
	// first batch of that epoch: it reads the head at the engine's
	// strongest consistency, fences every write of an earlier epoch above
	// it (UID >= UIDNext, MODSEQ > HighestModSeq) so that none can ever
	// become visible, however late it arrives, and returns the head. It is
	// idempotent for one epoch, and fails with ErrConflict when the
	// mailbox was adopted at a later epoch (the caller was deposed).
	AdoptMailbox(ctx context.Context, mailbox ID, epoch uint64) (Mailbox, error)
}
