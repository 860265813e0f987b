package history

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// The tests below each craft a history that breaks one invariant and show
// that Check reports exactly that invariant, and one or more legal
// variants of the same history that Check accepts. They are what shows
// the checker can fail.

var (
	inbox   = Mailbox{"alice@example.test", "INBOX"}
	archive = Mailbox{"alice@example.test", "Archive"}
)

const bob = "bob@example.test"

// hist builds a history: each op gets the next index, and unless it sets
// them, Invoke and Complete one tick apart after the previous op's.
type hist struct {
	ops []Op
	now Time
}

func (h *hist) add(op Op) *hist {
	op.Index = len(h.ops)
	if op.Invoke == 0 && op.Complete == 0 {
		h.now += 10
		op.Invoke, op.Complete = h.now, h.now+1
	}
	h.ops = append(h.ops, op)
	return h
}

func sum(token string) Sum { return SumOf([]byte("body of " + token)) }

func deliver(token string, o Outcome, users ...string) Op {
	op := Op{Process: 1, Kind: Deliver, Outcome: o, Token: token, Sum: sum(token)}
	for _, u := range users {
		op.Rcpts = append(op.Rcpts, Rcpt{User: u, Outcome: o})
	}
	return op
}

func appendTo(mb Mailbox, token string, o Outcome, uid uint32) Op {
	return Op{Process: 2, Kind: Append, Outcome: o, Mailbox: mb, Token: token, Sum: sum(token),
		Rcpts: []Rcpt{{mb.User, o}}, AppendUID: uid, AppendValidity: 7}
}

// msg is a fetched message with its body, flags and MODSEQ.
func msg(uid uint32, token string, flags ...string) Seen {
	return Seen{UID: uid, Token: token, Sum: sum(token), HasBody: true, Flags: flags, HasFlags: true}
}

func read(process int, mb Mailbox, msgs ...Seen) Op {
	return Op{Process: process, Kind: Read, Outcome: Ok, Mailbox: mb, View: &View{UIDValidity: 7, Complete: true, Messages: msgs}}
}

func final(mb Mailbox, msgs ...Seen) Op {
	op := read(99, mb, msgs...)
	op.Final = true
	return op
}

// expect checks that ops break exactly the invariants want (in any order,
// each at least once), or none.
func expect(t *testing.T, name string, ops []Op, want ...string) {
	t.Helper()
	res, err := Check(ops)
	if err != nil {
		t.Fatalf("%s: Check: %v", name, err)
	}
	got := map[string]bool{}
	for _, v := range res.Violations {
		got[v.Invariant] = true
	}
	var gotList []string
	for k := range got {
		gotList = append(gotList, k)
	}
	slices.Sort(gotList)
	slices.Sort(want)
	want = slices.Compact(want)
	if !slices.Equal(gotList, want) {
		var b strings.Builder
		_ = res.WriteReport(&b, 20)
		t.Errorf("%s: violations %v, want %v\n%s", name, gotList, want, b.String())
	}
	if res.OK() != (len(want) == 0) {
		t.Errorf("%s: OK() = %v with violations %v", name, res.OK(), gotList)
	}
}

func TestLost(t *testing.T) {
	expect(t, "acknowledged delivery missing", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(final(inbox)).ops, Lost)
	expect(t, "acknowledged delivery present", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(final(inbox, msg(1, "a"))).ops)
	expect(t, "ambiguous delivery missing", (&hist{}).
		add(deliver("a", Ambiguous, inbox.User)).
		add(final(inbox)).ops)
	expect(t, "missing after an ambiguous expunge", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(Op{Process: 3, Kind: Expunge, Outcome: Ambiguous, Mailbox: inbox, Targets: []Target{{"a", 1}}}).
		add(final(inbox)).ops)
	expect(t, "missing after a failed expunge", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(Op{Process: 3, Kind: Expunge, Outcome: Failed, Mailbox: inbox, Targets: []Target{{"a", 1}}}).
		add(final(inbox)).ops, Lost)
	// One recipient of two lost: LMTP's per-recipient outcomes.
	expect(t, "one recipient of two", (&hist{}).
		add(deliver("a", Ok, inbox.User, bob)).
		add(final(inbox, msg(1, "a"))).
		add(final(Mailbox{bob, "INBOX"})).ops, Lost)
	// An acknowledged message moved to another mailbox is not lost.
	expect(t, "moved away", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(Op{Process: 3, Kind: Move, Outcome: Ambiguous, Mailbox: inbox, Dest: "Archive", Targets: []Target{{"a", 1}}}).
		add(final(inbox)).
		add(final(archive, msg(1, "a"))).ops)
}

func TestDuplicated(t *testing.T) {
	expect(t, "delivered twice", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(final(inbox, msg(1, "a"), msg(2, "a"))).ops, Duplicated)
	// Ambiguous means at most once, not any number of times.
	expect(t, "ambiguous delivered twice", (&hist{}).
		add(deliver("a", Ambiguous, inbox.User)).
		add(final(inbox, msg(1, "a"), msg(2, "a"))).ops, Duplicated)
	expect(t, "in two mailboxes", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(final(inbox, msg(1, "a"))).
		add(final(archive, msg(1, "a"))).ops, Duplicated)
	expect(t, "ambiguous delivered once", (&hist{}).
		add(deliver("a", Ambiguous, inbox.User)).
		add(final(inbox, msg(1, "a"))).ops)
}

func TestCorrupt(t *testing.T) {
	bad := msg(1, "a")
	bad.Sum = SumOf([]byte("body of a, but one byte changed"))
	expect(t, "body differs", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(final(inbox, bad)).ops, Corrupt)
	expect(t, "body exact", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(final(inbox, msg(1, "a"))).ops)
}

func TestPhantom(t *testing.T) {
	expect(t, "failed delivery visible", (&hist{}).
		add(deliver("a", Failed, inbox.User)).
		add(final(inbox, msg(1, "a"))).ops, Phantom)
	expect(t, "another user's message", (&hist{}).
		add(deliver("a", Ok, bob)).
		add(final(Mailbox{bob, "INBOX"}, msg(1, "a"))).
		add(final(inbox, msg(1, "a"))).ops, Phantom)
	expect(t, "unknown token", (&hist{}).
		add(final(inbox, msg(1, "zz"))).ops, Phantom)
	expect(t, "ambiguous delivery visible", (&hist{}).
		add(deliver("a", Ambiguous, inbox.User)).
		add(final(inbox, msg(1, "a"))).ops)
}

func TestUIDOrder(t *testing.T) {
	// Process 5 saw UIDs 1 and 3, then 2 appeared below 3.
	expect(t, "new UID below one already seen", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(deliver("c", Ok, inbox.User)).
		add(read(5, inbox, msg(1, "a"), msg(3, "c"))).
		add(read(5, inbox, msg(1, "a"), msg(2, "b"), msg(3, "c"))).
		add(final(inbox, msg(1, "a"), msg(2, "b"), msg(3, "c"))).ops, UIDOrder)
	expect(t, "listing out of order", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(final(inbox, msg(2, "b"), msg(1, "a"))).ops, UIDOrder)
	// Another process that saw 3 first may see 2 later: per client.
	expect(t, "new UIDs above, and another process", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(deliver("c", Ok, inbox.User)).
		add(read(5, inbox, msg(1, "a"))).
		add(read(5, inbox, msg(1, "a"), msg(3, "c"))).
		add(read(6, inbox, msg(1, "a"), msg(2, "b"), msg(3, "c"))).
		add(final(inbox, msg(1, "a"), msg(2, "b"), msg(3, "c"))).ops)
	// An expunged UID that disappears is not a new one below.
	expect(t, "expunged below", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(read(5, inbox, msg(1, "a"), msg(2, "b"))).
		add(Op{Process: 3, Kind: Expunge, Outcome: Ok, Mailbox: inbox, Targets: []Target{{"a", 1}}}).
		add(read(5, inbox, msg(2, "b"))).
		add(final(inbox, msg(2, "b"))).ops)
}

func TestUIDReused(t *testing.T) {
	expect(t, "UID names two messages", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(read(5, inbox, msg(1, "a"))).
		add(Op{Process: 3, Kind: Expunge, Outcome: Ok, Mailbox: inbox, Targets: []Target{{"a", 1}}}).
		add(final(inbox, msg(1, "b"))).ops, UIDReused)
	expect(t, "APPENDUID given twice", (&hist{}).
		add(appendTo(inbox, "a", Ok, 4)).
		add(appendTo(inbox, "b", Ok, 4)).
		add(final(inbox, msg(4, "a"), msg(5, "b"))).ops, UIDReused)
	// A new UIDVALIDITY starts a new UID space.
	v := final(inbox, msg(1, "b"))
	v.View.UIDValidity = 8
	expect(t, "new UIDVALIDITY", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(read(5, inbox, msg(1, "a"))).
		add(Op{Process: 3, Kind: Expunge, Outcome: Ok, Mailbox: inbox, Targets: []Target{{"a", 1}}}).
		add(v).ops)
}

func TestModSeqDecreased(t *testing.T) {
	withModSeq := func(process int, hms uint64, modseq uint64) Op {
		s := msg(1, "a")
		s.ModSeq = modseq
		op := read(process, inbox, s)
		op.View.HighestModSeq = hms
		return op
	}
	expect(t, "HIGHESTMODSEQ falls", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(withModSeq(5, 10, 4)).
		add(withModSeq(5, 8, 4)).
		add(final(inbox, msg(1, "a"))).ops, ModSeqDecreased)
	expect(t, "message MODSEQ falls", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(withModSeq(5, 10, 9)).
		add(withModSeq(5, 10, 6)).
		add(final(inbox, msg(1, "a"))).ops, ModSeqDecreased)
	expect(t, "HIGHESTMODSEQ below a MODSEQ a STORE returned", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(Op{Process: 5, Kind: Store, Outcome: Ok, Mailbox: inbox, Flag: `\Flagged`, Add: true, Targets: []Target{{"a", 1}},
			View: &View{UIDValidity: 7, Messages: []Seen{{UID: 1, ModSeq: 12, Flags: []string{`\Flagged`}, HasFlags: true}}}}).
		add(withModSeq(5, 11, 12)).
		add(final(inbox, msg(1, "a", `\Flagged`))).ops, ModSeqDecreased)
	expect(t, "rising, and another process lower", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(withModSeq(5, 8, 4)).
		add(withModSeq(5, 10, 9)).
		add(withModSeq(6, 9, 4)).
		add(final(inbox, msg(1, "a"))).ops)
}

func store(process int, token string, uid uint32, flag string, add bool, o Outcome) Op {
	return Op{Process: process, Kind: Store, Outcome: o, Mailbox: inbox, Flag: flag, Add: add, Targets: []Target{{token, uid}}}
}

func TestFlagLost(t *testing.T) {
	expect(t, "acknowledged +FLAGS lost", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, `\Flagged`, true, Ok)).
		add(final(inbox, msg(1, "a"))).ops, FlagLost)
	expect(t, "acknowledged -FLAGS lost", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, "$Hist1", true, Ok)).
		add(store(3, "a", 1, "$Hist1", false, Ok)).
		add(final(inbox, msg(1, "a", "$hist1"))).ops, FlagLost)
	// A STORE that completed before the lost one was invoked cannot
	// explain it.
	expect(t, "earlier opposite store", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(4, "a", 1, `\Flagged`, false, Ok)).
		add(store(3, "a", 1, `\Flagged`, true, Ok)).
		add(final(inbox, msg(1, "a"))).ops, FlagLost)
	expect(t, "visible", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, `\Flagged`, true, Ok)).
		add(final(inbox, msg(1, "a", `\flagged`))).ops)
	// Overlapping opposite STOREs: either order is legal.
	h := (&hist{}).add(deliver("a", Ok, inbox.User))
	plus, minus := store(3, "a", 1, `\Flagged`, true, Ok), store(4, "a", 1, `\Flagged`, false, Ok)
	plus.Invoke, plus.Complete = 100, 110
	minus.Invoke, minus.Complete = 105, 115
	h.add(plus).add(minus)
	expect(t, "concurrent opposite stores, removed", slices.Clone(h.add(final(inbox, msg(1, "a"))).ops))
	h.ops[len(h.ops)-1] = final(inbox, msg(1, "a", `\Flagged`))
	h.ops[len(h.ops)-1].Index = len(h.ops) - 1
	expect(t, "concurrent opposite stores, added", h.ops)
	// An ambiguous later STORE may take effect at any time.
	expect(t, "ambiguous opposite store", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, `\Flagged`, true, Ok)).
		add(store(4, "a", 1, `\Flagged`, false, Ambiguous)).
		add(final(inbox, msg(1, "a"))).ops)
	// A STORE that raced a MOVE of its message reached nothing: no FETCH
	// came back, and the message is in the destination without the flag.
	race := (&hist{}).add(deliver("a", Ok, inbox.User))
	st, mv := store(3, "a", 1, `\Flagged`, true, Ok), Op{Process: 4, Kind: Move, Outcome: Ok, Mailbox: inbox, Dest: "Archive",
		Targets: []Target{{"a", 1}}, Moved: []UIDPair{{1, 2}}, DestValidity: 7}
	st.Invoke, st.Complete, mv.Invoke, mv.Complete = 100, 120, 105, 110
	race.add(st).add(mv).add(final(inbox)).add(final(archive, msg(2, "a")))
	expect(t, "store raced a move", race.ops)
	race.ops[1].View = &View{UIDValidity: 7, Messages: []Seen{{UID: 1, ModSeq: 9, Flags: []string{`\Flagged`}, HasFlags: true}}}
	expect(t, "store reached the source during a move", race.ops, MoveNotAtomic)
	race.ops[2].Invoke, race.ops[2].Complete = 130, 140
	expect(t, "store reached the message before a move", race.ops, FlagLost)
	// A flag follows its message through a MOVE.
	expect(t, "flag kept across a move", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, `\Flagged`, true, Ok)).
		add(Op{Process: 3, Kind: Move, Outcome: Ok, Mailbox: inbox, Dest: "Archive", Targets: []Target{{"a", 1}},
			Moved: []UIDPair{{1, 3}}, DestValidity: 7}).
		add(final(inbox)).
		add(final(archive, msg(3, "a"))).ops, FlagLost)
}

func TestFlagPhantom(t *testing.T) {
	expect(t, "flag from a failed store", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, "$Hist2", true, Failed)).
		add(final(inbox, msg(1, "a", "$Hist2"))).ops, FlagPhantom)
	expect(t, "flag from an ambiguous store", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, "$Hist2", true, Ambiguous)).
		add(final(inbox, msg(1, "a", "$Hist2"))).ops)
	// Flags no STORE manages (\Seen from a POP3 RETR, \Deleted left by
	// an expunge that failed half-way) are not checked.
	expect(t, "unmanaged flag", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, "$Hist2", true, Failed)).
		add(final(inbox, msg(1, "a", `\Seen`, `\Deleted`))).ops)
}

func TestExpungeRemoved(t *testing.T) {
	expect(t, "acknowledged expunge still there", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(Op{Process: 3, Kind: Expunge, Outcome: Ok, Mailbox: inbox, Targets: []Target{{"a", 1}}, View: &View{UIDValidity: 7}}).
		add(final(inbox, msg(1, "a"))).ops, RemoveLost)
	expect(t, "ambiguous expunge still there", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(Op{Process: 3, Kind: Expunge, Outcome: Ambiguous, Mailbox: inbox, Targets: []Target{{"a", 1}}}).
		add(final(inbox, msg(1, "a"))).ops)
	expect(t, "acknowledged expunge applied", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(Op{Process: 3, Kind: Expunge, Outcome: Ok, Mailbox: inbox, Targets: []Target{{"a", 1}}}).
		add(final(inbox)).ops)
}

func TestDele(t *testing.T) {
	dele := func(o Outcome, tokens ...string) Op {
		op := Op{Process: 4, Kind: Dele, Outcome: o, Mailbox: inbox}
		for _, tok := range tokens {
			op.Targets = append(op.Targets, Target{Token: tok})
		}
		return op
	}
	expect(t, "acknowledged DELE+QUIT still there", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(dele(Ok, "a")).
		add(final(inbox, msg(1, "a"), msg(2, "b"))).ops, RemoveLost)
	// It removed exactly those: b, not named, must stay.
	expect(t, "DELE+QUIT removed one more", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(dele(Ok, "a")).
		add(final(inbox)).ops, Lost)
	expect(t, "DELE without QUIT's +OK", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(dele(Ambiguous, "a")).
		add(final(inbox, msg(1, "a"))).ops)
	expect(t, "DELE+QUIT applied", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(deliver("b", Ok, inbox.User)).
		add(dele(Ok, "a")).
		add(final(inbox, msg(2, "b"))).ops)
}

func TestMove(t *testing.T) {
	move := func(o Outcome) Op {
		op := Op{Process: 3, Kind: Move, Outcome: o, Mailbox: inbox, Dest: "Archive", Targets: []Target{{"a", 1}},
			View: &View{UIDValidity: 7}}
		if o == Ok {
			op.Moved, op.DestValidity = []UIDPair{{1, 5}}, 7
		}
		return op
	}
	expect(t, "still in the source", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(move(Ok)).
		add(final(inbox, msg(1, "a"))).
		add(final(archive)).ops, MoveLost)
	expect(t, "in both", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(move(Ok)).
		add(final(inbox, msg(1, "a"))).
		add(final(archive, msg(5, "a"))).ops, MoveLost, Duplicated)
	expect(t, "not in the destination", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(move(Ok)).
		add(final(inbox)).
		add(final(archive)).ops, MoveLost, Lost)
	expect(t, "moved", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(move(Ok)).
		add(final(inbox)).
		add(final(archive, msg(5, "a"))).ops)
	// An interrupted MOVE that left both copies is its own invariant...
	expect(t, "failed move left both", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(move(Failed)).
		add(final(inbox, msg(1, "a"))).
		add(final(archive, msg(5, "a"))).ops, MoveNotAtomic)
	// ... but one interrupted MOVE explains one extra copy, not two (the
	// listing of Archive alone, with two, could be its work).
	expect(t, "two extra copies", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(move(Ambiguous)).
		add(final(inbox, msg(1, "a"))).
		add(final(archive, msg(5, "a"), msg(6, "a"))).ops, Duplicated, MoveNotAtomic)
	// Two overlapping acknowledged MOVEs of one message each copied it.
	h := (&hist{}).add(deliver("a", Ok, inbox.User))
	m1, m2 := move(Ok), move(Ok)
	m2.Moved = []UIDPair{{1, 6}}
	m1.Invoke, m1.Complete, m2.Invoke, m2.Complete = 100, 110, 105, 115
	h.add(m1).add(m2).add(final(inbox)).add(final(archive, msg(5, "a"), msg(6, "a")))
	expect(t, "concurrent moves, two copies", h.ops, MoveNotAtomic)
	// The same two MOVEs one after the other cannot explain two copies.
	h.ops[1].Invoke, h.ops[1].Complete, h.ops[2].Invoke, h.ops[2].Complete = 100, 110, 120, 130
	expect(t, "sequential moves, two copies", h.ops, Duplicated)
	// A listing of headers only names messages by token, without a sum.
	hdr := msg(5, "a")
	hdr.HasBody, hdr.Sum = false, Sum{}
	expect(t, "header-only listing of a duplicate", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(read(4, archive, hdr, Seen{UID: 6, Token: "a"})).
		add(final(inbox, msg(1, "a"))).ops, Duplicated)
	expect(t, "moved, then expunged ambiguously", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(move(Ok)).
		add(Op{Process: 4, Kind: Expunge, Outcome: Ambiguous, Mailbox: archive, Targets: []Target{{"a", 5}}}).
		add(final(inbox)).
		add(final(archive)).ops)
	expect(t, "ambiguous move, not applied", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(move(Ambiguous)).
		add(final(inbox, msg(1, "a"))).
		add(final(archive)).ops)
}

func TestUnchecked(t *testing.T) {
	expect(t, "no final read", (&hist{}).
		add(deliver("a", Ok, inbox.User)).ops, Unchecked)
	expect(t, "no final read of a move's destination", (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(Op{Process: 3, Kind: Move, Outcome: Ambiguous, Mailbox: inbox, Dest: "Archive", Targets: []Target{{"a", 1}}}).
		add(final(inbox)).ops, Unchecked)
}

func TestMalformed(t *testing.T) {
	for name, ops := range map[string][]Op{
		"token written twice": (&hist{}).add(deliver("a", Ok, inbox.User)).add(appendTo(inbox, "a", Ok, 0)).ops,
		"write without token": (&hist{}).add(deliver("", Ok, inbox.User)).ops,
		"no outcome":          (&hist{}).add(Op{Kind: Read}).ops,
	} {
		if _, err := Check(ops); err == nil {
			t.Errorf("%s: Check accepted a malformed history", name)
		}
	}
}

// TestJSON: a history survives a round trip through JSON (the harness
// writes one for a failed or long run) and checks the same.
func TestJSON(t *testing.T) {
	ops := (&hist{}).
		add(deliver("a", Ok, inbox.User)).
		add(store(3, "a", 1, `\Flagged`, true, Ok)).
		add(final(inbox, msg(1, "a"))).ops
	b, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	var back []Op
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	r1, _ := Check(ops)
	r2, err := Check(back)
	if err != nil {
		t.Fatal(err)
	}
	if len(r1.Violations) != 1 || len(r2.Violations) != 1 || r1.Violations[0].String() != r2.Violations[0].String() {
		t.Errorf("before %v, after the round trip %v", r1.Violations, r2.Violations)
	}
}
