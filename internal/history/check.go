package history

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// Invariants, as named in a Violation.
const (
	// Lost: an acknowledged message (per recipient) is in none of its
	// user's mailboxes at the end, and no operation that may have
	// happened (acknowledged or ambiguous) expunged or deleted it.
	Lost = "lost"
	// Duplicated: a message is present more than once among one user's
	// mailboxes (in one listing, or at the end): delivered twice, or
	// copied by a MOVE that left it in the source.
	Duplicated = "duplicated"
	// Corrupt: a body read back differs from the body sent.
	Corrupt = "corrupt"
	// Phantom: a message is visible that no acknowledged or ambiguous
	// operation wrote for that user.
	Phantom = "phantom"
	// UIDOrder: a listing's UIDs are not strictly increasing, or a client
	// saw a new message appear below a UID it had already seen in that
	// mailbox under the same UIDVALIDITY.
	UIDOrder = "uid-order"
	// UIDReused: one UID under one UIDVALIDITY named two messages.
	UIDReused = "uid-reused"
	// ModSeqDecreased: a client saw HIGHESTMODSEQ fall below a MODSEQ it
	// had seen in that mailbox, or a message's MODSEQ fall.
	ModSeqDecreased = "modseq-decreased"
	// FlagLost: an acknowledged STORE is not visible at the end, and no
	// other STORE of that flag on that message may have followed it.
	FlagLost = "flag-lost"
	// FlagPhantom: a message carries, at the end, a flag that clients
	// manage (one some STORE names) and that no STORE may have added.
	FlagPhantom = "flag-phantom"
	// RemoveLost: a message an acknowledged EXPUNGE or POP3 DELE+QUIT
	// removed is still there at the end.
	RemoveLost = "remove-lost"
	// MoveNotAtomic: what a MOVE that is not one atomic step lets clients
	// see: an interrupted MOVE (failed or ambiguous) leaves the message in
	// both mailboxes; two concurrent MOVEs of one message each copy it; a
	// STORE acknowledged between a MOVE's copy and its expunge is lost.
	// Quill's MOVE is one batch of the node's user manager, but nodes
	// sharing Cassandra do not order each other's batches yet (issue 35).
	// It is told apart from Duplicated and FlagLost, which it would
	// otherwise be, so that a run can report this known limit without
	// hiding a real duplicate or a real lost flag.
	MoveNotAtomic = "move-not-atomic"
	// MoveLost: after an acknowledged MOVE, a moved message is still in
	// the source, or is not in the destination under the UID COPYUID gave
	// it (and nothing may have removed it from there since).
	MoveLost = "move-lost"
	// Unchecked: a mailbox that could hold messages has no final read, so
	// its messages' fate is unknown. A history that ends without its final
	// reads proves nothing.
	Unchecked = "unchecked"
)

// Violation is one broken invariant.
type Violation struct {
	Invariant string `json:"invariant"`
	Mailbox   string `json:"mailbox,omitempty"`
	Token     string `json:"token,omitempty"`
	UID       uint32 `json:"uid,omitempty"`
	Ops       []int  `json:"ops,omitempty"` // the indexes of the operations involved
	Detail    string `json:"detail"`
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", v.Invariant)
	if v.Mailbox != "" {
		fmt.Fprintf(&b, " %s", v.Mailbox)
	}
	if v.UID != 0 {
		fmt.Fprintf(&b, " uid %d", v.UID)
	}
	if v.Token != "" {
		fmt.Fprintf(&b, " token %s", v.Token)
	}
	if len(v.Ops) > 0 {
		fmt.Fprintf(&b, " ops %v", v.Ops)
	}
	fmt.Fprintf(&b, ": %s", v.Detail)
	return b.String()
}

// Result is what Check found.
type Result struct {
	// Counts is the number of operations by kind and outcome.
	Counts map[Kind]map[Outcome]int
	// Messages is the number of messages (recipient, token) written by an
	// operation that did not fail; Acked of them were acknowledged, and
	// Present were found at the end.
	Messages, Acked, Present int
	Violations               []Violation
}

// OK reports whether no invariant was broken.
func (r *Result) OK() bool { return len(r.Violations) == 0 }

// ByInvariant counts the violations of each invariant.
func (r *Result) ByInvariant() map[string]int {
	m := map[string]int{}
	for _, v := range r.Violations {
		m[v.Invariant]++
	}
	return m
}

// WriteReport writes the counts and up to maxViolations violations as
// plain text.
func (r *Result) WriteReport(w io.Writer, maxViolations int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %8s %8s %10s\n", "kind", "ok", "failed", "ambiguous")
	for _, k := range Kinds {
		c := r.Counts[k]
		fmt.Fprintf(&b, "%-8s %8d %8d %10d\n", k, c[Ok], c[Failed], c[Ambiguous])
	}
	fmt.Fprintf(&b, "messages %d (acknowledged %d), present at the end %d\n", r.Messages, r.Acked, r.Present)
	by := r.ByInvariant()
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(&b, "violations %d", len(r.Violations))
	for _, n := range names {
		fmt.Fprintf(&b, " %s=%d", n, by[n])
	}
	b.WriteByte('\n')
	for i, v := range r.Violations {
		if i == maxViolations {
			fmt.Fprintf(&b, "... %d more\n", len(r.Violations)-i)
			break
		}
		fmt.Fprintf(&b, "  %s\n", v)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// inst is one message: a token in one user's mailboxes.
type inst struct{ user, token string }

// place is a UID under one UIDVALIDITY of one mailbox.
type place struct {
	mb       Mailbox
	validity uint32
	uid      uint32
}

// located is where a message is at the end.
type located struct {
	mb    Mailbox
	uid   uint32
	flags []string
}

type checker struct {
	ops     []Op
	res     *Result
	creates map[string]*Op // by token
	// placed is the message each placement was seen to hold, and the
	// first operation that saw it.
	placed map[place]placed
	// reported suppresses a second violation of one invariant for one
	// message (a phantom is seen by every later read).
	reported map[string]bool
	finals   map[Mailbox]*View
	final    map[inst][]located
	// acting is, by token, every operation whose Targets name it.
	acting map[string][]*Op
}

type placed struct {
	token string
	op    int
}

// Check verifies a history; see the package comment and the invariant
// constants. It returns an error, and no Result, for a history that is not
// well formed (a write without a token, a token written twice, an
// operation without an outcome).
func Check(ops []Op) (*Result, error) {
	c := &checker{
		ops:      slices.Clone(ops),
		res:      &Result{Counts: map[Kind]map[Outcome]int{}},
		creates:  map[string]*Op{},
		placed:   map[place]placed{},
		reported: map[string]bool{},
		finals:   map[Mailbox]*View{},
		final:    map[inst][]located{},
		acting:   map[string][]*Op{},
	}
	sort.SliceStable(c.ops, func(i, j int) bool { return c.ops[i].Index < c.ops[j].Index })
	if err := c.index(); err != nil {
		return nil, err
	}
	c.observations()
	c.perProcess()
	c.finalState()
	return c.res, nil
}

func (c *checker) violate(v Violation) { c.res.Violations = append(c.res.Violations, v) }

// once reports whether key is new, marking it.
func (c *checker) once(key string) bool {
	if c.reported[key] {
		return false
	}
	c.reported[key] = true
	return true
}

func (c *checker) index() error {
	for i := range c.ops {
		op := &c.ops[i]
		if _, ok := kindNames[op.Kind]; !ok {
			return fmt.Errorf("history: op %d has unknown kind %d", op.Index, op.Kind)
		}
		if _, ok := outcomeNames[op.Outcome]; !ok {
			return fmt.Errorf("history: op %d (%s) has no outcome", op.Index, op.Kind)
		}
		m := c.res.Counts[op.Kind]
		if m == nil {
			m = map[Outcome]int{}
			c.res.Counts[op.Kind] = m
		}
		m[op.Outcome]++
		seen := map[string]bool{}
		for _, t := range op.Targets {
			if !seen[t.Token] {
				seen[t.Token] = true
				c.acting[t.Token] = append(c.acting[t.Token], op)
			}
		}
		if op.Kind != Deliver && op.Kind != Append {
			continue
		}
		if op.Token == "" {
			return fmt.Errorf("history: op %d (%s) writes a message without a token", op.Index, op.Kind)
		}
		if prev, ok := c.creates[op.Token]; ok {
			return fmt.Errorf("history: ops %d and %d write the same token %q", prev.Index, op.Index, op.Token)
		}
		c.creates[op.Token] = op
	}
	return nil
}

// outcomeFor returns the outcome of token's write for user: 0 when user
// was not a recipient.
func (c *checker) outcomeFor(token, user string) Outcome {
	op := c.creates[token]
	if op == nil {
		return 0
	}
	if op.Kind == Append {
		if op.Mailbox.User == user {
			return op.Outcome
		}
		return 0
	}
	for _, r := range op.Rcpts {
		if r.User == user {
			if op.Outcome == Failed {
				return Failed // the whole transaction failed
			}
			return r.Outcome
		}
	}
	return 0
}

// instances lists every (user, token) a write addressed, with its outcome.
func (c *checker) instances() []struct {
	inst
	op      *Op
	outcome Outcome
	mb      Mailbox // where it was written
} {
	type entry = struct {
		inst
		op      *Op
		outcome Outcome
		mb      Mailbox
	}
	var out []entry
	for i := range c.ops {
		op := &c.ops[i]
		switch op.Kind {
		case Append:
			out = append(out, entry{inst{op.Mailbox.User, op.Token}, op, op.Outcome, op.Mailbox})
		case Deliver:
			for _, r := range op.Rcpts {
				out = append(out, entry{inst{r.User, op.Token}, op, c.outcomeFor(op.Token, r.User), Mailbox{r.User, "INBOX"}})
			}
		}
	}
	return out
}

// observations checks every message any operation saw: that some write
// may have put it there, byte-exact; listings in strictly increasing UID
// order without duplicates; and one message per placement, counting the
// placements APPENDUID and COPYUID announced.
func (c *checker) observations() {
	for i := range c.ops {
		op := &c.ops[i]
		if op.Kind == Append && op.Outcome == Ok && op.AppendUID != 0 {
			c.place(op, place{op.Mailbox, op.AppendValidity, op.AppendUID}, op.Token)
		}
		if op.Kind == Move && op.Outcome == Ok {
			dst := Mailbox{op.Mailbox.User, op.Dest}
			for _, p := range op.Moved {
				if tok := targetToken(op.Targets, p.From); tok != "" {
					c.place(op, place{dst, op.DestValidity, p.To}, tok)
				}
			}
		}
		v := op.View
		if v == nil {
			continue
		}
		var prev uint32
		inView := map[string]uint32{}
		for _, s := range v.Messages {
			if v.Complete {
				if s.UID <= prev {
					c.violate(Violation{Invariant: UIDOrder, Mailbox: op.Mailbox.String(), UID: s.UID, Ops: []int{op.Index},
						Detail: fmt.Sprintf("listing has UID %d after UID %d", s.UID, prev)})
				}
				prev = s.UID
			}
			if s.Token == "" {
				continue
			}
			if u, dup := inView[s.Token]; dup {
				inv, ops := Duplicated, []int{op.Index}
				if moves, ok := c.moveExplains(op.Mailbox.User, s.Token, 2); ok {
					inv, ops = MoveNotAtomic, append(ops, moves...)
				}
				if c.once(fmt.Sprintf("%s\x00%s\x00%s\x00%d\x00%d", inv, op.Mailbox, s.Token, u, s.UID)) {
					c.violate(Violation{Invariant: inv, Mailbox: op.Mailbox.String(), Token: s.Token, UID: s.UID, Ops: ops,
						Detail: fmt.Sprintf("one listing shows the message under UIDs %d and %d", u, s.UID)})
				}
			}
			inView[s.Token] = s.UID
			c.sight(op, v, s)
		}
	}
}

// because returns ": <the op's error>" when it has one.
func because(op *Op) string {
	if op.Error == "" {
		return ""
	}
	return " (it failed with: " + op.Error + ")"
}

func targetToken(ts []Target, uid uint32) string {
	for _, t := range ts {
		if t.UID == uid {
			return t.Token
		}
	}
	return ""
}

func (c *checker) sight(op *Op, v *View, s Seen) {
	mb := op.Mailbox
	key := mb.User + "\x00" + s.Token
	cr := c.creates[s.Token]
	switch o := c.outcomeFor(s.Token, mb.User); {
	case cr == nil || o == 0:
		if c.once(Phantom + "\x00" + key) {
			c.violate(Violation{Invariant: Phantom, Mailbox: mb.String(), Token: s.Token, UID: s.UID, Ops: []int{op.Index},
				Detail: "a message no operation wrote for this user"})
		}
	case o == Failed:
		if c.once(Phantom + "\x00" + key) {
			c.violate(Violation{Invariant: Phantom, Mailbox: mb.String(), Token: s.Token, UID: s.UID, Ops: []int{cr.Index, op.Index},
				Detail: "the message of a failed " + cr.Kind.String() + " is visible" + because(cr)})
		}
	case s.HasBody && s.Sum != cr.Sum:
		if c.once(Corrupt + "\x00" + key) {
			c.violate(Violation{Invariant: Corrupt, Mailbox: mb.String(), Token: s.Token, UID: s.UID, Ops: []int{cr.Index, op.Index},
				Detail: fmt.Sprintf("body read back has sum %s, sent %s", s.Sum, cr.Sum)})
		}
	}
	c.place(op, place{mb, v.UIDValidity, s.UID}, s.Token)
}

// place records that p holds token, reporting a second message for it.
func (c *checker) place(op *Op, p place, token string) {
	prev, ok := c.placed[p]
	if !ok {
		c.placed[p] = placed{token, op.Index}
		return
	}
	if prev.token != token && c.once(fmt.Sprintf("%s\x00%v\x00%s", UIDReused, p, token)) {
		c.violate(Violation{Invariant: UIDReused, Mailbox: p.mb.String(), UID: p.uid, Token: token, Ops: []int{prev.op, op.Index},
			Detail: fmt.Sprintf("UID %d (UIDVALIDITY %d) named message %s and then %s", p.uid, p.validity, prev.token, token)})
	}
}

// perProcess checks what each client saw, in the order it saw it: no new
// UID below one it already saw (complete listings only, since a partial
// view says nothing of what it omits), no HIGHESTMODSEQ below a MODSEQ it
// already saw, no message's MODSEQ going down.
func (c *checker) perProcess() {
	type mbState struct {
		maxUID     uint32
		maxUIDOp   int
		seen       map[uint32]bool
		maxModSeq  uint64
		maxModOp   int
		msgModSeq  map[uint32]uint64
		msgModSeqO map[uint32]int
	}
	type key struct {
		process  int
		mb       Mailbox
		validity uint32
	}
	states := map[key]*mbState{}
	for i := range c.ops { // Index order is each process's order: one op at a time
		op := &c.ops[i]
		v := op.View
		if v == nil {
			continue
		}
		k := key{op.Process, op.Mailbox, v.UIDValidity}
		st := states[k]
		if st == nil {
			st = &mbState{seen: map[uint32]bool{}, msgModSeq: map[uint32]uint64{}, msgModSeqO: map[uint32]int{}}
			states[k] = st
		}
		mb := op.Mailbox.String()
		if h := v.HighestModSeq; h != 0 {
			if h < st.maxModSeq {
				c.violate(Violation{Invariant: ModSeqDecreased, Mailbox: mb, Ops: []int{st.maxModOp, op.Index},
					Detail: fmt.Sprintf("process %d saw HIGHESTMODSEQ %d after MODSEQ %d", op.Process, h, st.maxModSeq)})
			} else {
				st.maxModSeq, st.maxModOp = h, op.Index
			}
		}
		maxUID, maxOp := st.maxUID, st.maxUIDOp
		for _, s := range v.Messages {
			if v.Complete {
				if !st.seen[s.UID] && s.UID < st.maxUID {
					c.violate(Violation{Invariant: UIDOrder, Mailbox: mb, UID: s.UID, Token: s.Token, Ops: []int{st.maxUIDOp, op.Index},
						Detail: fmt.Sprintf("process %d first saw UID %d after it had seen UID %d", op.Process, s.UID, st.maxUID)})
				}
				st.seen[s.UID] = true
				if s.UID > maxUID {
					maxUID, maxOp = s.UID, op.Index
				}
			}
			if s.ModSeq != 0 {
				if prev, ok := st.msgModSeq[s.UID]; ok && s.ModSeq < prev {
					c.violate(Violation{Invariant: ModSeqDecreased, Mailbox: mb, UID: s.UID, Token: s.Token, Ops: []int{st.msgModSeqO[s.UID], op.Index},
						Detail: fmt.Sprintf("process %d saw the message's MODSEQ %d after %d", op.Process, s.ModSeq, prev)})
				}
				st.msgModSeq[s.UID], st.msgModSeqO[s.UID] = s.ModSeq, op.Index
				if s.ModSeq > st.maxModSeq {
					st.maxModSeq, st.maxModOp = s.ModSeq, op.Index
				}
			}
		}
		st.maxUID, st.maxUIDOp = maxUID, maxOp
	}
}

// mayFollow reports whether b may have taken effect after a did: b was not
// Failed and did not complete before a was invoked. An Ambiguous b may
// take effect at any time after its invocation.
func mayFollow(a, b *Op) bool {
	if b.Outcome == Failed || a.Index == b.Index {
		return false
	}
	return b.Outcome == Ambiguous || b.Complete > a.Invoke
}

func hasFlag(flags []string, f string) bool {
	for _, x := range flags {
		if strings.EqualFold(x, f) {
			return true
		}
	}
	return false
}

func (v *View) find(uid uint32) (Seen, bool) {
	for _, s := range v.Messages {
		if s.UID == uid {
			return s, true
		}
	}
	return Seen{}, false
}

// finalState checks the final reads against the acknowledged writes.
func (c *checker) finalState() {
	for i := range c.ops {
		op := &c.ops[i]
		if op.Final && op.Outcome == Ok && op.View != nil && op.View.Complete {
			c.finals[op.Mailbox] = op.View // the last one read wins
		}
	}
	// Every mailbox a message may be in needs a final read.
	needed := map[Mailbox]bool{}
	incomplete := map[string]bool{} // users with a mailbox left unread
	for _, e := range c.instances() {
		if e.outcome != Failed {
			needed[e.mb] = true
		}
	}
	for i := range c.ops {
		if op := &c.ops[i]; op.Kind == Move && op.Outcome != Failed {
			needed[Mailbox{op.Mailbox.User, op.Dest}] = true
		}
	}
	var missing []Mailbox
	for mb := range needed {
		if c.finals[mb] == nil {
			missing = append(missing, mb)
		}
	}
	sort.Slice(missing, func(i, j int) bool { return missing[i].String() < missing[j].String() })
	for _, mb := range missing {
		incomplete[mb.User] = true
		c.violate(Violation{Invariant: Unchecked, Mailbox: mb.String(), Detail: "no final read of a mailbox that may hold messages"})
	}
	for mb, v := range c.finals {
		for _, s := range v.Messages {
			if s.Token != "" {
				k := inst{mb.User, s.Token}
				c.final[k] = append(c.final[k], located{mb, s.UID, s.Flags})
			}
		}
	}

	c.messages(incomplete)
	c.removals()
	c.moves()
	c.flags()
}

// messages checks each written message's fate: present at most once, and
// present if acknowledged unless something may have removed it.
func (c *checker) messages(incomplete map[string]bool) {
	for _, e := range c.instances() {
		if e.outcome == Failed {
			continue // a sighting is a Phantom, reported by observations
		}
		c.res.Messages++
		if e.outcome == Ok {
			c.res.Acked++
		}
		locs := c.final[e.inst]
		if len(locs) > 0 {
			c.res.Present++
		}
		if len(locs) > 1 {
			where := make([]string, len(locs))
			for i, l := range locs {
				where[i] = fmt.Sprintf("%s uid %d", l.mb, l.uid)
			}
			inv, ops := Duplicated, []int{e.op.Index}
			if moves, ok := c.moveExplains(e.user, e.token, len(locs)); ok {
				inv, ops = MoveNotAtomic, append(ops, moves...)
			}
			c.violate(Violation{Invariant: inv, Mailbox: e.user, Token: e.token, Ops: ops,
				Detail: "present " + fmt.Sprint(len(locs)) + " times at the end: " + strings.Join(where, ", ")})
		}
		if e.outcome != Ok || len(locs) > 0 || incomplete[e.user] {
			continue
		}
		var removers []int
		for _, op := range c.acting[e.token] {
			if (op.Kind == Expunge || op.Kind == Dele) && op.Outcome != Failed && op.Mailbox.User == e.user {
				removers = append(removers, op.Index)
			}
		}
		if len(removers) == 0 {
			detail := "acknowledged " + e.op.Kind.String() + " is in none of the user's mailboxes, and nothing removed it"
			ops := []int{e.op.Index}
			for _, op := range c.acting[e.token] {
				if (op.Kind == Expunge || op.Kind == Dele) && op.Outcome == Failed && op.Mailbox.User == e.user {
					detail += fmt.Sprintf("; op %d, a %s of it, failed%s", op.Index, op.Kind, because(op))
					ops = append(ops, op.Index)
				}
			}
			c.violate(Violation{Invariant: Lost, Mailbox: e.mb.String(), Token: e.token, Ops: ops, Detail: detail})
		}
	}
}

// moveExplains reports whether copies of token among user's mailboxes
// can be the work of non-atomic MOVEs (see MoveNotAtomic): each MOVE may
// leave one extra copy, provided one of them was interrupted (not Ok) or
// two of them overlapped in time. It returns those MOVEs.
func (c *checker) moveExplains(user, token string, copies int) ([]int, bool) {
	var moves []*Op
	for _, m := range c.acting[token] {
		if m.Kind == Move && m.Mailbox.User == user {
			moves = append(moves, m)
		}
	}
	if copies > 1+len(moves) {
		return nil, false
	}
	racy := false
	for i, a := range moves {
		if a.Outcome != Ok {
			racy = true
		}
		for _, b := range moves[i+1:] {
			if overlap(a, b) {
				racy = true
			}
		}
	}
	if !racy {
		return nil, false
	}
	idx := make([]int, len(moves))
	for i, m := range moves {
		idx[i] = m.Index
	}
	return idx, true
}

// overlap reports whether a and b may have run at the same time.
func overlap(a, b *Op) bool {
	return mayFollow(a, b) && mayFollow(b, a)
}

// removals checks that every acknowledged EXPUNGE and DELE+QUIT removed
// its targets from its mailbox.
func (c *checker) removals() {
	for i := range c.ops {
		op := &c.ops[i]
		if op.Outcome != Ok || (op.Kind != Expunge && op.Kind != Dele) {
			continue
		}
		fin := c.finals[op.Mailbox]
		if fin == nil {
			continue
		}
		for _, t := range op.Targets {
			if op.Kind == Expunge {
				// UIDs are never reused: the placement stays empty.
				if op.View != nil && op.View.UIDValidity != fin.UIDValidity {
					continue
				}
				// Another message under that UID is a UIDReused.
				if s, ok := fin.find(t.UID); ok && (s.Token == "" || s.Token == t.Token) {
					c.violate(Violation{Invariant: RemoveLost, Mailbox: op.Mailbox.String(), UID: t.UID, Token: s.Token, Ops: []int{op.Index},
						Detail: "acknowledged EXPUNGE, but the UID is still in the mailbox at the end"})
				}
				continue
			}
			// POP3 names messages by token: it may legitimately be back
			// in the mailbox if a MOVE into it may have followed.
			s, ok := findToken(fin, t.Token)
			if !ok || c.mayReenter(op, t.Token) {
				continue
			}
			c.violate(Violation{Invariant: RemoveLost, Mailbox: op.Mailbox.String(), UID: s.UID, Token: t.Token, Ops: []int{op.Index},
				Detail: "acknowledged POP3 DELE+QUIT, but the message is still in the maildrop at the end"})
		}
	}
}

func findToken(v *View, token string) (Seen, bool) {
	for _, s := range v.Messages {
		if s.Token != "" && s.Token == token {
			return s, true
		}
	}
	return Seen{}, false
}

// mayReenter reports whether token may have been moved into op's mailbox
// after op.
func (c *checker) mayReenter(op *Op, token string) bool {
	for _, m := range c.acting[token] {
		if m.Kind == Move && m.Mailbox.User == op.Mailbox.User && m.Dest == op.Mailbox.Name && mayFollow(op, m) {
			return true
		}
	}
	return false
}

// mayLeave reports whether token may have been removed from (or moved out
// of) mb by an operation that may have followed op.
func (c *checker) mayLeave(op *Op, mb Mailbox, token string) bool {
	for _, r := range c.acting[token] {
		if (r.Kind == Expunge || r.Kind == Dele || r.Kind == Move) && r.Mailbox == mb && mayFollow(op, r) {
			return true
		}
	}
	return false
}

// moves checks that every acknowledged MOVE left its targets out of the
// source and in the destination under the UIDs COPYUID gave them.
func (c *checker) moves() {
	for i := range c.ops {
		op := &c.ops[i]
		if op.Kind != Move || op.Outcome != Ok {
			continue
		}
		if src := c.finals[op.Mailbox]; src != nil && (op.View == nil || op.View.UIDValidity == src.UIDValidity) {
			for _, t := range op.Targets {
				if s, ok := src.find(t.UID); ok && (s.Token == "" || s.Token == t.Token) && !c.mayReenter(op, t.Token) {
					c.violate(Violation{Invariant: MoveLost, Mailbox: op.Mailbox.String(), UID: t.UID, Token: s.Token, Ops: []int{op.Index},
						Detail: "acknowledged MOVE to " + op.Dest + ", but the message is still in the source at the end"})
				}
			}
		}
		dstMB := Mailbox{op.Mailbox.User, op.Dest}
		dst := c.finals[dstMB]
		if dst == nil || dst.UIDValidity != op.DestValidity {
			continue
		}
		for _, p := range op.Moved {
			tok := targetToken(op.Targets, p.From)
			if tok == "" {
				continue
			}
			if s, ok := dst.find(p.To); ok {
				_ = s // a different message there is a UIDReused, reported by observations
				continue
			}
			if c.mayLeave(op, dstMB, tok) {
				continue
			}
			c.violate(Violation{Invariant: MoveLost, Mailbox: dstMB.String(), UID: p.To, Token: tok, Ops: []int{op.Index},
				Detail: fmt.Sprintf("acknowledged MOVE gave UID %d in the destination, which is empty at the end", p.To)})
		}
	}
}

// flags checks acknowledged STOREs against the final flags, and that no
// managed flag appeared that no STORE may have set.
func (c *checker) flags() {
	managed := map[string]bool{}
	for i := range c.ops {
		op := &c.ops[i]
		if op.Kind != Store || op.Outcome != Ok {
			if op.Kind == Store {
				managed[strings.ToLower(op.Flag)] = true
			}
			continue
		}
		managed[strings.ToLower(op.Flag)] = true
		for _, t := range op.Targets {
			locs := c.final[inst{op.Mailbox.User, t.Token}]
			if len(locs) != 1 {
				continue // removed, lost or duplicated: reported elsewhere
			}
			if hasFlag(locs[0].flags, op.Flag) == op.Add {
				continue
			}
			if c.storeMayFollow(op, t.Token) {
				continue
			}
			// A STORE by UID on a message moved or expunged meanwhile
			// changes nothing and still ends OK; the server's FETCH
			// response says whether it reached the message.
			if !reached(op, t.UID) && c.mayHaveLeft(op, t.Token) {
				continue
			}
			verb := "added"
			if !op.Add {
				verb = "removed"
			}
			// A STORE that reached the source while an overlapping MOVE
			// had already copied the message is lost with the source.
			if m := c.racingMove(op, t.Token, locs[0].mb); m != nil {
				c.violate(Violation{Invariant: MoveNotAtomic, Mailbox: locs[0].mb.String(), UID: locs[0].uid, Token: t.Token, Ops: []int{op.Index, m.Index},
					Detail: fmt.Sprintf("acknowledged STORE %s %s during a MOVE to %s, final flags (%s)", verb, op.Flag, m.Dest, strings.Join(locs[0].flags, " "))})
				continue
			}
			c.violate(Violation{Invariant: FlagLost, Mailbox: locs[0].mb.String(), UID: locs[0].uid, Token: t.Token, Ops: []int{op.Index},
				Detail: fmt.Sprintf("acknowledged STORE %s %s, final flags (%s)", verb, op.Flag, strings.Join(locs[0].flags, " "))})
		}
	}
	for k, locs := range c.final {
		for _, l := range locs {
			for _, f := range l.flags {
				if !managed[strings.ToLower(f)] || c.mayHaveAdded(k, f) {
					continue
				}
				c.violate(Violation{Invariant: FlagPhantom, Mailbox: l.mb.String(), UID: l.uid, Token: k.token,
					Detail: "flag " + f + " is set at the end, and no STORE may have added it"})
			}
		}
	}
}

// racingMove returns an Ok MOVE of token out of op's mailbox into dst
// that overlapped op, if there is one.
func (c *checker) racingMove(op *Op, token string, dst Mailbox) *Op {
	for _, m := range c.acting[token] {
		if m.Kind == Move && m.Outcome == Ok && m.Mailbox == op.Mailbox && m.Mailbox.User == dst.User && m.Dest == dst.Name && overlap(op, m) {
			return m
		}
	}
	return nil
}

// mayHaveLeft reports whether token may have been moved or removed out
// of op's mailbox before op took effect: by an operation that did not
// fail and was invoked before op completed.
func (c *checker) mayHaveLeft(op *Op, token string) bool {
	for _, r := range c.acting[token] {
		if (r.Kind == Expunge || r.Kind == Dele || r.Kind == Move) && r.Mailbox == op.Mailbox && r.Outcome != Failed && r.Invoke < op.Complete {
			return true
		}
	}
	return false
}

// reached reports whether a Store's FETCH responses name uid.
func reached(op *Op, uid uint32) bool {
	if op.View == nil {
		return false
	}
	_, ok := op.View.find(uid)
	return ok
}

func (c *checker) storeMayFollow(op *Op, token string) bool {
	for _, s := range c.acting[token] {
		if s.Kind == Store && s.Mailbox.User == op.Mailbox.User && strings.EqualFold(s.Flag, op.Flag) && mayFollow(op, s) {
			return true
		}
	}
	return false
}

func (c *checker) mayHaveAdded(k inst, flag string) bool {
	for _, s := range c.acting[k.token] {
		if s.Kind == Store && s.Add && s.Outcome != Failed && s.Mailbox.User == k.user && strings.EqualFold(s.Flag, flag) {
			return true
		}
	}
	return false
}
