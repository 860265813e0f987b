package mailbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"quill/internal/store"
)

// View is one IMAP session's selected mailbox (RFC 3501 section 6.3.1,
// RFC 9051 section 6.3.2): it owns the session's message sequence numbers
// and the changes not yet told to the client.
//
// Invariants:
//   - uids is the client's idea of the mailbox: message sequence number n
//     is uids[n-1], ascending. It changes only in Poll, which returns the
//     EXPUNGE and EXISTS responses that tell the client of the change, so
//     the client and the view never disagree about a number.
//   - modseq is the position in the store's change log up to which the
//     view has taken changes in; a change above it is still to be read.
//   - gone holds UIDs expunged in the store but still numbered for the
//     client, because the command running may not send EXPUNGE (RFC 3501
//     section 7.4.1: not during FETCH, STORE or SEARCH).
//   - every UID below uidNext that uids does not hold has been expunged.
//
// Changes reach a view by one path, whoever made them (this session,
// another one, SMTP delivery): the store's change log, read by Poll. The
// Hub only says when to read it. A View is used by one goroutine.
type View struct {
	u        *User
	id       store.ID
	readOnly bool

	uidValidity uint32
	uids        []uint32
	uidNext     uint32
	modseq      uint64
	gone        map[uint32]struct{}
	// own holds the flag changes this session made and reported itself
	// (STORE), so that Poll does not report them a second time.
	own map[uint32]uint64
	// recent are the UID ranges this session claimed as \Recent
	// (IMAP4rev1), ascending and disjoint.
	recent []UIDRange

	notify <-chan struct{}
	cancel func()
}

// Message is one message of a selected mailbox.
type Message struct {
	Seq          uint32
	UID          uint32
	ModSeq       uint64
	Flags        []string // sorted
	InternalDate time.Time
	Size         int64
	// Meta is the pre-computed message summary stored at delivery or
	// kept by KeepMeta (nil for messages stored without one).
	Meta []byte
	blob store.ID
}

// SelectInfo is what SELECT/EXAMINE report (RFC 9051 section 6.3.2).
type SelectInfo struct {
	Exists        uint32
	Recent        uint32
	FirstUnseen   uint32 // sequence number of the first message without \Seen; 0 if none
	UIDValidity   uint32
	UIDNext       uint32
	HighestModSeq uint64
	// Keywords are the keywords in use in the mailbox, sorted.
	Keywords []string
}

// Select opens a mailbox as a View. readOnly is EXAMINE. The caller must
// Close the view.
func (u *User) Select(ctx context.Context, name string, readOnly bool) (*View, SelectInfo, error) {
	name = CanonicalName(name)
	mb, err := u.m.st.GetMailbox(ctx, u.user, name)
	if err != nil {
		return nil, SelectInfo{}, classify(err, name)
	}
	// Subscribe before reading, so no change committed after the read
	// goes unannounced.
	notify, cancel := u.m.hub.Subscribe(mb.ID)
	v := &View{u: u, id: mb.ID, readOnly: readOnly, uidValidity: mb.UIDValidity, modseq: mb.HighestModSeq,
		gone: map[uint32]struct{}{}, own: map[uint32]uint64{}, notify: notify, cancel: cancel}
	info := SelectInfo{UIDValidity: mb.UIDValidity, UIDNext: mb.UIDNext, HighestModSeq: mb.HighestModSeq}
	keywords := map[string]struct{}{}
	v.uids = make([]uint32, 0, mb.Messages)
	err = u.scan(ctx, mb.ID, func(m store.Message) {
		v.uids = append(v.uids, m.UID)
		if info.FirstUnseen == 0 && !hasFlag(m.Flags, store.FlagSeen) {
			info.FirstUnseen = uint32(len(v.uids))
		}
		for _, f := range m.Flags {
			if len(keywords) < maxKeywords && (f == "" || f[0] != '\\') {
				keywords[f] = struct{}{}
			}
		}
	})
	if err != nil {
		cancel()
		return nil, SelectInfo{}, err
	}
	if n := len(v.uids); n > 0 {
		// The listing may include messages appended after GetMailbox.
		info.UIDNext = max(info.UIDNext, v.uids[n-1]+1)
	}
	v.uidNext = info.UIDNext
	if !readOnly {
		v.claimRecent(info.UIDNext)
	}
	info.Exists = uint32(len(v.uids))
	info.Recent = v.recentCount()
	for k := range keywords {
		info.Keywords = append(info.Keywords, k)
	}
	sort.Strings(info.Keywords)
	return v, info, nil
}

// maxKeywords bounds the keywords a SELECT announces in FLAGS.
const maxKeywords = 256

// Close ends the view's notifications.
func (v *View) Close() { v.cancel() }

// Changed returns a channel that receives a value when the mailbox may
// have changed; then Poll tells what changed.
func (v *View) Changed() <-chan struct{} { return v.notify }

// ReadOnly reports whether the view was opened with EXAMINE.
func (v *View) ReadOnly() bool { return v.readOnly }

// UIDValidity is the mailbox's UIDVALIDITY.
func (v *View) UIDValidity() uint32 { return v.uidValidity }

// Len is the number of messages the client knows (the last EXISTS).
func (v *View) Len() uint32 { return uint32(len(v.uids)) }

// UID returns the UID of sequence number seq (1 <= seq <= Len()).
func (v *View) UID(seq uint32) uint32 { return v.uids[seq-1] }

// Seq returns the sequence number of uid, or 0 if the client does not
// know it.
func (v *View) Seq(uid uint32) uint32 {
	i, ok := slices.BinarySearch(v.uids, uid)
	if !ok {
		return 0
	}
	return uint32(i + 1)
}

// MaxUID is the highest UID the client knows, or 0.
func (v *View) MaxUID() uint32 {
	if len(v.uids) == 0 {
		return 0
	}
	return v.uids[len(v.uids)-1]
}

// UIDRange is the UIDs Lo through Hi, inclusive.
type UIDRange struct{ Lo, Hi uint32 }

// RangesOf returns ascending UIDs as the fewest ranges.
func RangesOf(uids []uint32) []UIDRange {
	var out []UIDRange
	for _, u := range uids {
		if n := len(out); n > 0 && out[n-1].Hi+1 == u {
			out[n-1].Hi = u
			continue
		}
		out = append(out, UIDRange{u, u})
	}
	return out
}

// claimRecent claims \Recent for the UIDs below uidNext no other session
// has claimed.
func (v *View) claimRecent(uidNext uint32) {
	first := v.u.m.hub.claimRecent(v.id, uidNext)
	if uidNext == 0 || first > uidNext-1 {
		return
	}
	if n := len(v.recent); n > 0 && v.recent[n-1].Hi+1 == first {
		v.recent[n-1].Hi = uidNext - 1
		return
	}
	v.recent = append(v.recent, UIDRange{first, uidNext - 1})
}

// Recent reports whether uid is \Recent in this session (IMAP4rev1).
func (v *View) Recent(uid uint32) bool {
	for _, r := range v.recent {
		if uid >= r.Lo && uid <= r.Hi {
			return true
		}
	}
	return false
}

func (v *View) recentCount() uint32 {
	var n int
	for _, r := range v.recent {
		i, _ := slices.BinarySearch(v.uids, r.Lo)
		j, _ := slices.BinarySearch(v.uids, r.Hi+1)
		n += j - i
	}
	return uint32(n)
}

// Updates are the untagged responses a Poll owes the client, in the order
// they must be sent: EXPUNGEs, then EXISTS (and RECENT), then FETCH FLAGS.
type Updates struct {
	// Expunged are sequence numbers, each valid when its EXPUNGE is sent
	// (they are in descending order, so none shifts another).
	Expunged []uint32
	// ExpungedUIDs are the same messages' UIDs, ascending, for VANISHED
	// (RFC 7162 section 3.2.10).
	ExpungedUIDs []uint32
	// Exists is true when EXISTS (and, in IMAP4rev1, RECENT) must be sent;
	// the values are Len() and RecentCount.
	Exists      bool
	RecentCount uint32
	// Flags are messages whose flags changed, with their sequence numbers.
	Flags []Message
}

// Poll reads the change log and brings the view up to date. With
// allowExpunge false, expunged messages keep their numbers (and are
// remembered) until a Poll that allows it.
func (v *View) Poll(ctx context.Context, allowExpunge bool) (Updates, error) {
	var up Updates
	var added, flagged []uint32
	seenFlag := map[uint32]bool{}
	max0, since := v.MaxUID(), v.modseq
	for {
		page, err := v.u.m.st.Changes(ctx, v.id, v.modseq, pageSize)
		if errors.Is(err, store.ErrExpungesForgotten) {
			added, flagged, err = v.relist(ctx, since, max0)
			if err != nil {
				return up, err
			}
			break
		}
		if err != nil {
			return up, classify(err, "changes")
		}
		for _, c := range page {
			v.modseq = c.ModSeq
			v.uidNext = max(v.uidNext, c.UID+1)
			if c.UID > max0 {
				if c.Kind != store.ChangeExpunged && !seenFlag[c.UID] {
					seenFlag[c.UID] = true
					added = append(added, c.UID)
				}
				continue
			}
			if v.Seq(c.UID) == 0 {
				continue
			}
			if _, ok := v.gone[c.UID]; ok {
				continue
			}
			switch c.Kind {
			case store.ChangeExpunged:
				v.gone[c.UID] = struct{}{}
			case store.ChangeFlags, store.ChangeAdded:
				if ms, ok := v.own[c.UID]; ok && ms >= c.ModSeq {
					continue
				}
				if !seenFlag[c.UID] {
					seenFlag[c.UID] = true
					flagged = append(flagged, c.UID)
				}
			}
		}
		if len(page) < pageSize {
			break
		}
	}
	clear(v.own)
	if allowExpunge && len(v.gone) > 0 {
		kept := v.uids[:0]
		var expunged []uint32
		for i, uid := range v.uids {
			if _, ok := v.gone[uid]; ok {
				expunged = append(expunged, uint32(i+1))
				up.ExpungedUIDs = append(up.ExpungedUIDs, uid)
				continue
			}
			kept = append(kept, uid)
		}
		v.uids = kept
		clear(v.gone)
		slices.Reverse(expunged)
		up.Expunged = expunged
	}
	if len(added) > 0 {
		slices.Sort(added)
		v.uids = append(v.uids, added...)
		if !v.readOnly {
			v.claimRecent(added[len(added)-1] + 1)
		}
		up.Exists = true
		up.RecentCount = v.recentCount()
	}
	if len(flagged) > 0 {
		slices.Sort(flagged)
		err := v.Messages(ctx, flagged, func(m Message) error {
			up.Flags = append(up.Flags, m)
			return nil
		})
		if err != nil {
			return up, err
		}
	}
	return up, nil
}

// Messages calls fn for each message of uids (ascending, known to the
// client) that still exists, in UID order, with its sequence number. It
// returns ErrExpunged (after the others) if some no longer exist.
func (v *View) Messages(ctx context.Context, uids []uint32, fn func(Message) error) error {
	missing := false
	for i := 0; i < len(uids); {
		// A run of consecutive sequence numbers is one store call.
		seq := v.Seq(uids[i])
		if seq == 0 {
			missing = true
			i++
			continue
		}
		j := i + 1
		for j < len(uids) && j-i < pageSize && int(seq)+j-i <= len(v.uids) && v.uids[int(seq)-1+j-i] == uids[j] {
			j++
		}
		page, err := v.u.m.st.ListMessages(ctx, v.id, uids[i], j-i)
		if err != nil {
			return classify(err, "list messages")
		}
		k := 0
		for n, uid := range uids[i:j] {
			for k < len(page) && page[k].UID < uid {
				k++
			}
			if k == len(page) || page[k].UID != uid {
				missing = true
				continue
			}
			m := page[k]
			if _, ok := v.gone[uid]; ok {
				missing = true
				continue
			}
			err := fn(Message{Seq: seq + uint32(n), UID: uid, ModSeq: m.ModSeq, Flags: m.Flags,
				InternalDate: m.InternalDate, Size: m.Size, Meta: m.Meta, blob: m.Blob})
			if err != nil {
				return err
			}
		}
		i = j
	}
	if missing {
		return ErrExpunged
	}
	return nil
}

// KeepsMeta reports whether KeepMeta stores anything: whether the store
// records summaries computed after delivery (store.MetaSetter).
func (v *View) KeepsMeta() bool {
	_, ok := v.u.m.st.(store.MetaSetter)
	return ok
}

// KeepMeta records summaries computed for messages stored without one
// (Message.Meta), by UID, so that later readers need not parse their
// bodies again. It is best effort: messages expunged meanwhile are
// skipped, and a store that cannot record them keeps nothing.
func (v *View) KeepMeta(ctx context.Context, metas map[uint32][]byte) error {
	ms, ok := v.u.m.st.(store.MetaSetter)
	if !ok || len(metas) == 0 {
		return nil
	}
	if err := ms.SetMeta(ctx, v.id, metas); err != nil {
		return classify(err, "keep message summaries")
	}
	return nil
}

// BodyReader reads a stored message. It is not safe for concurrent use.
type BodyReader interface {
	io.ReadSeekCloser
	io.ReaderAt
	Size() int64
}

// Open returns the stored bytes of m.
func (v *View) Open(ctx context.Context, m Message) (BodyReader, error) {
	r, err := v.u.m.st.OpenBlob(ctx, m.blob)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: UID %d: %w", ErrExpunged, m.UID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("mailbox: opening UID %d: %w", m.UID, err)
	}
	return r, nil
}

// FlagOp says how SetFlags combines flags with a message's flags.
type FlagOp uint8

const (
	FlagsReplace FlagOp = iota // FLAGS
	FlagsAdd                   // +FLAGS
	FlagsRemove                // -FLAGS
)

// SetFlags changes the flags of uids (ascending) and returns the messages
// whose flags changed, with their new flags and sequence numbers. The
// caller reports them (or not, for .SILENT); Poll will not report them
// again.
func (v *View) SetFlags(ctx context.Context, uids []uint32, op FlagOp, flags []string) ([]Message, error) {
	changed, _, err := v.SetFlagsIf(ctx, uids, op, flags, 0)
	return changed, err
}

// SetFlagsIf is SetFlags with the CONDSTORE UNCHANGEDSINCE test (RFC 7162
// section 3.1.3): with unchangedSince non-zero, messages whose MODSEQ is
// above it are left alone and returned in failed (UIDs, ascending).
func (v *View) SetFlagsIf(ctx context.Context, uids []uint32, op FlagOp, flags []string, unchangedSince uint64) (changed []Message, failed []uint32, err error) {
	if v.readOnly {
		return nil, nil, ErrReadOnly
	}
	uids = v.live(uids)
	if len(uids) == 0 {
		return nil, nil, nil
	}
	res, err := v.u.m.st.SetFlags(ctx, v.id, store.FlagChange{UIDs: uids, Op: store.FlagOp(op), Flags: flags, UnchangedSince: unchangedSince})
	if err != nil {
		return nil, nil, classify(err, "store flags")
	}
	changed = make([]Message, 0, len(res.Changed))
	for _, m := range res.Changed {
		seq := v.Seq(m.UID)
		if seq == 0 {
			continue
		}
		v.own[m.UID] = m.ModSeq
		changed = append(changed, Message{Seq: seq, UID: m.UID, ModSeq: m.ModSeq, Flags: m.Flags,
			InternalDate: m.InternalDate, Size: m.Size, Meta: m.Meta, blob: m.Blob})
	}
	return changed, res.Failed, nil
}

// live returns the uids not known to be expunged.
func (v *View) live(uids []uint32) []uint32 {
	if len(v.gone) == 0 {
		return uids
	}
	out := make([]uint32, 0, len(uids))
	for _, u := range uids {
		if _, ok := v.gone[u]; !ok {
			out = append(out, u)
		}
	}
	return out
}

// Expunge removes uids from the mailbox. The client learns of it, with
// sequence numbers, from the next Poll that allows expunges.
func (v *View) Expunge(ctx context.Context, uids []uint32) error {
	if v.readOnly {
		return ErrReadOnly
	}
	uids = v.live(uids)
	if len(uids) == 0 {
		return nil
	}
	_, _, err := v.u.m.st.Expunge(ctx, v.id, uids)
	return classify(err, "expunge")
}

// CopyResult reports a COPY or MOVE (RFC 4315 COPYUID): source UIDs and
// the UIDs their copies got, pairwise.
type CopyResult struct {
	UIDValidity uint32
	Source      []uint32
	Dest        []uint32
}

// Copy copies the messages uids (ascending) to the mailbox dest, with their
// flags and internal dates (RFC 3501 section 6.4.7). Each batch of
// pageSize messages is atomic; a failure part-way leaves the earlier
// batches copied.
func (v *View) Copy(ctx context.Context, uids []uint32, dest string) (CopyResult, error) {
	return v.copy(ctx, uids, dest)
}

// Move moves the messages uids (ascending) to the mailbox dest (RFC 6851),
// pageSize at a time, each page atomically: a message is in exactly one
// of the two mailboxes at every moment. The user's usage does not grow,
// so there is no quota check. The view learns of the expunges from its
// next Poll, like any other. A message expunged meanwhile is skipped and
// reported as ErrExpunged with the others moved.
func (v *View) Move(ctx context.Context, uids []uint32, dest string) (CopyResult, error) {
	if v.readOnly {
		return CopyResult{}, ErrReadOnly
	}
	dest = CanonicalName(dest)
	mb, err := v.u.m.st.GetMailbox(ctx, v.u.user, dest)
	if err != nil {
		return CopyResult{}, classify(err, dest)
	}
	res := CopyResult{UIDValidity: mb.UIDValidity}
	live := v.live(uids)
	for rest := live; len(rest) > 0; {
		page := rest[:min(len(rest), pageSize)]
		rest = rest[len(page):]
		src, dst, err := v.u.m.st.Move(ctx, v.id, page, mb.ID)
		if err != nil {
			return res, classify(err, dest)
		}
		res.Source = append(res.Source, src...)
		res.Dest = append(res.Dest, dst...)
	}
	if len(res.Source) < len(uids) {
		return res, ErrExpunged
	}
	return res, nil
}

func (v *View) copy(ctx context.Context, uids []uint32, dest string) (CopyResult, error) {
	dest = CanonicalName(dest)
	mb, err := v.u.m.st.GetMailbox(ctx, v.u.user, dest)
	if err != nil {
		return CopyResult{}, classify(err, dest)
	}
	res := CopyResult{UIDValidity: mb.UIDValidity}
	var batch []store.Message
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		stored, err := v.u.m.st.Append(ctx, mb.ID, newMessages(batch), store.AppendOptions{CheckQuota: true})
		if err != nil {
			return classify(err, dest)
		}
		res.Source = append(res.Source, uidsOf(batch)...)
		res.Dest = append(res.Dest, uidsOf(stored)...)
		batch = batch[:0]
		return nil
	}
	err = v.Messages(ctx, uids, func(m Message) error {
		batch = append(batch, store.Message{UID: m.UID, Flags: m.Flags, InternalDate: m.InternalDate, Size: m.Size, Blob: m.blob, Meta: m.Meta})
		if len(batch) == pageSize {
			return flush()
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrExpunged) {
		return res, err
	}
	if ferr := flush(); ferr != nil {
		return res, ferr
	}
	return res, err
}

// relist brings the view up to date by comparing its UIDs with the
// mailbox's, for when the change log no longer reaches back to since
// (store.ErrExpungesForgotten): UIDs the view numbers and the mailbox
// lacks are gone, UIDs above max0 are added, and a numbered message whose
// MODSEQ is above since may have changed. It ends at a MODSEQ read before
// the listing, so later changes are read again from the log, and seen
// twice at worst.
func (v *View) relist(ctx context.Context, since uint64, max0 uint32) (added, flagged []uint32, err error) {
	mb, err := v.u.m.st.GetMailboxByID(ctx, v.id)
	if err != nil {
		return nil, nil, classify(err, "mailbox")
	}
	i := 0
	err = v.u.scan(ctx, v.id, func(m store.Message) {
		if m.UID > max0 {
			added = append(added, m.UID)
			return
		}
		for ; i < len(v.uids) && v.uids[i] < m.UID; i++ {
			v.gone[v.uids[i]] = struct{}{}
		}
		if i == len(v.uids) || v.uids[i] != m.UID {
			return
		}
		i++
		if ms, ok := v.own[m.UID]; m.ModSeq > since && !(ok && ms >= m.ModSeq) {
			flagged = append(flagged, m.UID)
		}
	})
	if err != nil {
		return nil, nil, err
	}
	for ; i < len(v.uids); i++ {
		v.gone[v.uids[i]] = struct{}{}
	}
	v.modseq = max(v.modseq, mb.HighestModSeq)
	v.uidNext = max(v.uidNext, mb.UIDNext)
	if n := len(added); n > 0 {
		v.uidNext = max(v.uidNext, added[n-1]+1)
	}
	return added, flagged, nil
}

// HighestModSeq is the MODSEQ up to which the view has taken changes in
// (RFC 7162 HIGHESTMODSEQ): every change at or below it has been, or is
// being, told to the client.
func (v *View) HighestModSeq() uint64 { return v.modseq }

// ChangesSince answers a client resynchronizing from modseq (RFC 7162
// QRESYNC, CHANGEDSINCE ... VANISHED): the UIDs expunged after modseq
// that the view no longer numbers (vanished, ascending ranges), and the
// UIDs the view numbers whose state changed after modseq (changed,
// ascending). Only changes up to HighestModSeq count; later ones are
// Poll's. While the store remembers the expunges after modseq, vanished
// is exact; once it has forgotten them, vanished is every UID below the
// view's UIDNEXT it does not number, which RFC 7162 section 5 allows (a
// client ignores UIDs it does not hold), and costs ranges, not UIDs.
func (v *View) ChangesSince(ctx context.Context, modseq uint64) (vanished []UIDRange, changed []uint32, err error) {
	var expunged []uint32
	since := modseq
	for since < v.modseq {
		page, err := v.u.m.st.Changes(ctx, v.id, since, pageSize)
		if errors.Is(err, store.ErrExpungesForgotten) {
			return v.changesByListing(ctx, modseq)
		}
		if err != nil {
			return nil, nil, classify(err, "changes")
		}
		for _, c := range page {
			if c.ModSeq > v.modseq {
				break
			}
			_, gone := v.gone[c.UID]
			switch {
			case c.Kind == store.ChangeExpunged && v.Seq(c.UID) == 0:
				expunged = append(expunged, c.UID)
			case c.Kind != store.ChangeExpunged && v.Seq(c.UID) != 0 && !gone:
				changed = append(changed, c.UID)
			}
		}
		if len(page) < pageSize {
			break
		}
		since = page[len(page)-1].ModSeq
	}
	slices.Sort(expunged)
	slices.Sort(changed)
	return RangesOf(slices.Compact(expunged)), slices.Compact(changed), nil
}

// changesByListing is ChangesSince without the change log: the gaps in
// the view's UIDs below uidNext, and the numbered messages whose MODSEQ
// lies in (since, HighestModSeq].
func (v *View) changesByListing(ctx context.Context, since uint64) (vanished []UIDRange, changed []uint32, err error) {
	next := uint32(1)
	for _, uid := range v.uids {
		if uid > next {
			vanished = append(vanished, UIDRange{next, uid - 1})
		}
		next = uid + 1
	}
	if v.uidNext > next {
		vanished = append(vanished, UIDRange{next, v.uidNext - 1})
	}
	err = v.u.scan(ctx, v.id, func(m store.Message) {
		if _, gone := v.gone[m.UID]; !gone && m.ModSeq > since && m.ModSeq <= v.modseq && v.Seq(m.UID) != 0 {
			changed = append(changed, m.UID)
		}
	})
	return vanished, changed, err
}

// UIDs returns the UIDs the client knows, by sequence number (index
// seq-1). The slice must not be modified and is valid until the next Poll.
func (v *View) UIDs() []uint32 { return v.uids }
