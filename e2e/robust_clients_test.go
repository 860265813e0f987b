package e2e

// The robustness harness's clients: each operation is one session against
// one node, over real TCP, bounded by robustOpTimeout, recorded in a
// history.Recorder with its outcome (ok, failed: definitely not applied,
// ambiguous: the request went out and no answer came). See
// robust_test.go for the run and internal/history for the checker.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"quill/internal/history"
	"quill/internal/loadgen"
)

// historyHeader carries a message's token; the body around it is unique
// to the operation that wrote it, and its checksum is recorded.
const historyHeader = "X-Quill-History"

// robustOpTimeout bounds one operation, connection to last reply. It is
// longer than Quill's own per-request Cassandra timeout (12 s), so that
// an ambiguous outcome means a node that stopped answering.
const robustOpTimeout = 25 * time.Second

// robustFlags are the flags STORE operations manage (\Seen and \Deleted
// are left alone: POP3 and EXPUNGE use them).
var robustFlags = []string{`\Flagged`, `\Answered`, "$Hist1"}

// robustNodes is the address book the clients pick nodes from; the
// nemesis adds to it. A node that is down keeps its (pinned) addresses:
// a client that picks it fails to connect.
type robustNodes struct {
	mu    sync.Mutex
	nodes []*Server
}

func (n *robustNodes) add(s *Server) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes = append(n.nodes, s)
	return len(n.nodes) - 1
}

func (n *robustNodes) all() []*Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.nodes)
}

// pick returns a random node's name and listener addresses.
func (n *robustNodes) pick(r *rand.Rand) (string, map[string]string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := r.IntN(len(n.nodes))
	return "q" + strconv.Itoa(i), n.nodes[i].Addrs()
}

// robustClient is one process of the history: it runs one operation at a
// time, each against a random node.
type robustClient struct {
	id        int
	rec       *history.Recorder
	nodes     *robustNodes
	users     []string
	passwords map[string]string
	r         *rand.Rand
	seq       int
}

// robustBody returns a message unique to token: CRLF lines, some starting
// with a dot (SMTP transparency), a random filler.
func robustBody(r *rand.Rand, token, to string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "From: <robust@remote.test>\r\nTo: <%s>\r\nSubject: robust %s\r\n", to, token)
	fmt.Fprintf(&b, "Message-ID: <%s@robust.test>\r\n%s: %s\r\nMIME-Version: 1.0\r\n\r\n", token, historyHeader, token)
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 ."
	lines := 5 + r.IntN(60)
	for i := 0; i < lines; i++ {
		if r.IntN(8) == 0 {
			b.WriteByte('.')
		}
		n := 10 + r.IntN(66)
		for j := 0; j < n; j++ {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		b.WriteString("\r\n")
	}
	return []byte(b.String())
}

// observe returns the token and checksum of a message as read back,
// without the trace fields a receiving server prepends.
func observe(raw []byte) (string, history.Sum) {
	m := loadgen.StripTrace(raw)
	tok, _ := loadgen.HeaderValue(m, historyHeader)
	return tok, history.SumOf(m)
}

func (c *robustClient) token() string {
	c.seq++
	return fmt.Sprintf("p%d-%d-%x", c.id, c.seq, c.r.Uint32())
}

// run performs operations until ctx ends, choosing each kind by weight.
func (c *robustClient) run(ctx context.Context) {
	type kind struct {
		weight int
		fn     func(context.Context)
	}
	kinds := []kind{
		{4, func(ctx context.Context) { c.deliver(ctx, false) }},
		{2, func(ctx context.Context) { c.deliver(ctx, true) }},
		{3, c.append},
		{3, c.store},
		{2, c.expunge},
		{2, c.move},
		{1, c.idle},
		{2, c.read},
		{2, c.dele},
	}
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	for ctx.Err() == nil {
		n := c.r.IntN(total)
		for _, k := range kinds {
			if n < k.weight {
				k.fn(ctx)
				break
			}
			n -= k.weight
		}
	}
}

// opContext bounds one operation; the run's end cancels it too, and the
// operation is then recorded as what it was at that moment.
func opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), robustOpTimeout)
}

func (c *robustClient) user() string { return c.users[c.r.IntN(len(c.users))] }

// deliver sends one new message to one or two users over SMTP or LMTP.
func (c *robustClient) deliver(ctx context.Context, lmtp bool) {
	node, addrs := c.nodes.pick(c.r)
	rcpts := []string{c.user()}
	if c.r.IntN(3) == 0 {
		if u := c.user(); u != rcpts[0] {
			rcpts = append(rcpts, u)
		}
	}
	tok := c.token()
	body := robustBody(c.r, tok, rcpts[0])
	op := c.rec.Begin(c.id, node, history.Deliver)
	op.Token, op.Sum = tok, history.SumOf(body)
	listener := "smtp"
	if lmtp {
		listener = "lmtp"
	}
	res := smtpTransaction(addrs[listener], time.Now().Add(robustOpTimeout), lmtp, "robust@remote.test", rcpts, body)
	accepted := 0
	for i, u := range rcpts {
		o := history.Failed
		if res.Accepted[i] {
			k := 0
			if lmtp {
				k = accepted
			}
			accepted++
			switch {
			case k < len(res.Final) && res.Final[k] == 250:
				o = history.Ok
			case k < len(res.Final) && res.Final[k] != 0:
				o = history.Failed
			case res.DataSent:
				o = history.Ambiguous // the end of the data went out; no reply
			}
		}
		op.Rcpts = append(op.Rcpts, history.Rcpt{User: u, Outcome: o})
	}
	err := res.Err
	for i, code := range res.Final {
		if code != 250 && err == nil {
			err = fmt.Errorf("end of data: %d %s", code, res.FinalText[i]) // a refusal, kept for the report
		}
	}
	outcome := history.Failed
	for _, r := range op.Rcpts {
		if r.Outcome == history.Ok && outcome == history.Failed {
			outcome = history.Ok
		}
		if r.Outcome == history.Ambiguous {
			outcome = history.Ambiguous
		}
	}
	c.rec.End(op, outcome, err)
}

// imapSession dials a random node, logs in and enables CONDSTORE.
func (c *robustClient) imapSession(ctx context.Context, user string) (*loadgen.IMAPClient, string, error) {
	node, addrs := c.nodes.pick(c.r)
	cl, err := loadgen.DialIMAP(ctx, nil, addrs["imap"], robustOpTimeout)
	if err != nil {
		return nil, node, err
	}
	if err := cl.Login(user, c.passwords[user]); err != nil {
		cl.Close()
		return nil, node, err
	}
	if _, err := cl.Command("ENABLE CONDSTORE", 1<<16, nil); err != nil {
		cl.Close()
		return nil, node, err
	}
	return cl, node, nil
}

// selectAndList selects mb and lists every message (UID, flags, MODSEQ
// and either the whole body or only the token's header field): a
// complete view of the mailbox.
func selectAndList(cl *loadgen.IMAPClient, mb string, bodies bool) (*history.View, int, error) {
	v := &history.View{}
	exists := 0
	_, err := cl.Command("SELECT "+mb+" (CONDSTORE)", 1<<16, func(r *loadgen.IMAPResponse) error {
		line := string(r.Lines[0])
		if n, ok := strings.CutSuffix(line, " EXISTS"); ok {
			exists, _ = strconv.Atoi(strings.TrimPrefix(n, "* "))
		}
		if text, ok := strings.CutPrefix(line, "* OK "); ok {
			if name, args, ok := loadgen.ResponseCode(text); ok && len(args) == 1 {
				switch name {
				case "UIDVALIDITY":
					u, _ := strconv.ParseUint(args[0], 10, 32)
					v.UIDValidity = uint32(u)
				case "HIGHESTMODSEQ":
					v.HighestModSeq, _ = strconv.ParseUint(args[0], 10, 63)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("SELECT %s: %w", mb, err)
	}
	if err := listInto(cl, v, bodies); err != nil {
		return nil, 0, err
	}
	return v, exists, nil
}

// listInto fetches every message of the selected mailbox into v, in
// sequence order, and marks v complete.
func listInto(cl *loadgen.IMAPClient, v *history.View, bodies bool) error {
	item := "BODY.PEEK[HEADER.FIELDS (" + historyHeader + ")]"
	if bodies {
		item = "BODY.PEEK[]"
	}
	bySeq := map[uint32]history.Seen{}
	_, err := cl.Command("UID FETCH 1:* (UID FLAGS MODSEQ "+item+")", 64<<20, func(r *loadgen.IMAPResponse) error {
		it, ok, err := loadgen.ParseFetch(r)
		if err != nil || !ok || it.UID == 0 || !it.HasBody {
			return err // unsolicited updates carry no body: skipped
		}
		s := history.Seen{UID: it.UID, Flags: it.Flags, HasFlags: it.HasFlags, ModSeq: it.ModSeq}
		if bodies {
			s.Token, s.Sum = observe(it.Body)
			s.HasBody = true
		} else {
			s.Token, _ = loadgen.HeaderValue(it.Body, historyHeader)
		}
		bySeq[it.Seq] = s
		return nil
	})
	if err != nil {
		return fmt.Errorf("UID FETCH: %w", err)
	}
	seqs := make([]uint32, 0, len(bySeq))
	for k := range bySeq {
		seqs = append(seqs, k)
	}
	slices.Sort(seqs)
	v.Messages = v.Messages[:0]
	for _, k := range seqs {
		v.Messages = append(v.Messages, bySeq[k])
	}
	v.Complete = true
	return nil
}

// listed opens a session for user on a random node and lists mb, recorded
// as a Read of its own that ends before the write that follows in the
// same session begins. ok is false when the read failed (the session is
// then closed).
func (c *robustClient) listed(ctx context.Context, user, mb string) (cl *loadgen.IMAPClient, node string, v *history.View, exists int, ok bool) {
	cl, node, err := c.imapSession(ctx, user)
	op := c.rec.Begin(c.id, node, history.Read)
	op.Mailbox = history.Mailbox{User: user, Name: mb}
	if err == nil {
		v, exists, err = selectAndList(cl, mb, false)
	}
	if err != nil {
		if cl != nil {
			cl.Close()
		}
		c.rec.End(op, history.Failed, err)
		return nil, node, nil, 0, false
	}
	op.View = v
	c.rec.End(op, history.Ok, nil)
	return cl, node, v, exists, true
}

// outcomeOf classifies the error of the command that decides an
// operation: a refusal is Failed, no answer is Ambiguous.
func outcomeOf(err error) history.Outcome {
	var se *loadgen.IMAPStatusError
	switch {
	case err == nil:
		return history.Ok
	case errors.As(err, &se):
		return history.Failed
	}
	return history.Ambiguous
}

// pickTargets returns up to n distinct random messages of v that carry a
// token.
func (c *robustClient) pickTargets(v *history.View, n int) []history.Target {
	var out []history.Target
	for _, i := range c.r.Perm(len(v.Messages)) {
		if len(out) == n {
			break
		}
		if s := v.Messages[i]; s.Token != "" {
			out = append(out, history.Target{Token: s.Token, UID: s.UID})
		}
	}
	return out
}

func uidList(ts []history.Target) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = strconv.FormatUint(uint64(t.UID), 10)
	}
	return strings.Join(s, ",")
}

// append APPENDs one new message to INBOX (or, less often, Archive).
func (c *robustClient) append(ctx context.Context) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	user := c.user()
	mb := "INBOX"
	if c.r.IntN(4) == 0 {
		mb = "Archive"
	}
	tok := c.token()
	body := robustBody(c.r, tok, user)
	cl, node, err := c.imapSession(ctx, user)
	op := c.rec.Begin(c.id, node, history.Append)
	op.Mailbox, op.Token, op.Sum = history.Mailbox{User: user, Name: mb}, tok, history.SumOf(body)
	if err != nil {
		op.Rcpts = []history.Rcpt{{User: user, Outcome: history.Failed}}
		c.rec.End(op, history.Failed, err)
		return
	}
	defer cl.Close()
	text, err := cl.Append(mb, body, 1<<16, nil)
	o := outcomeOf(err)
	if name, args, ok := loadgen.ResponseCode(text); o == history.Ok && ok && name == "APPENDUID" && len(args) == 2 {
		v, _ := strconv.ParseUint(args[0], 10, 32)
		u, _ := strconv.ParseUint(args[1], 10, 32)
		op.AppendValidity, op.AppendUID = uint32(v), uint32(u)
	}
	op.Rcpts = []history.Rcpt{{User: user, Outcome: o}}
	c.rec.End(op, o, err)
	_, _ = cl.Command("LOGOUT", 1<<16, nil)
}

// store adds or removes one managed flag on one message with
// UNCHANGEDSINCE its MODSEQ as listed (RFC 7162 section 3.1.3).
func (c *robustClient) store(ctx context.Context) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	user := c.user()
	cl, node, v, _, ok := c.listed(ctx, user, "INBOX")
	if !ok {
		return
	}
	defer cl.Close()
	targets := c.pickTargets(v, 1)
	if len(targets) == 0 {
		return
	}
	op := c.rec.Begin(c.id, node, history.Store)
	op.Mailbox, op.Targets = history.Mailbox{User: user, Name: "INBOX"}, targets
	op.Flag, op.Add = robustFlags[c.r.IntN(len(robustFlags))], c.r.IntN(3) != 0
	var modseq uint64
	for _, s := range v.Messages {
		if s.UID == targets[0].UID {
			modseq = s.ModSeq
		}
	}
	sign := "+"
	if !op.Add {
		sign = "-"
	}
	// The FETCH responses say what the STORE reached, with its MODSEQ.
	resp := &history.View{UIDValidity: v.UIDValidity}
	text, err := cl.Command(fmt.Sprintf("UID STORE %d (UNCHANGEDSINCE %d) %sFLAGS (%s)", targets[0].UID, modseq, sign, op.Flag), 1<<16,
		func(r *loadgen.IMAPResponse) error {
			it, ok, err := loadgen.ParseFetch(r)
			if err != nil || !ok || it.UID == 0 {
				return err
			}
			resp.Messages = append(resp.Messages, history.Seen{UID: it.UID, Flags: it.Flags, HasFlags: it.HasFlags, ModSeq: it.ModSeq})
			return nil
		})
	o := outcomeOf(err)
	if name, _, ok := loadgen.ResponseCode(text); o == history.Ok && ok && name == "MODIFIED" {
		o, err = history.Failed, errors.New(text) // RFC 7162: not applied
	}
	op.View = resp
	c.rec.End(op, o, err)
	_, _ = cl.Command("LOGOUT", 1<<16, nil)
}

// expunge marks 1 to 3 messages \Deleted and expunges exactly them with
// UID EXPUNGE (RFC 4315), in INBOX or Archive.
func (c *robustClient) expunge(ctx context.Context) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	user := c.user()
	mb := "INBOX"
	if c.r.IntN(3) == 0 {
		mb = "Archive"
	}
	cl, node, v, exists, ok := c.listed(ctx, user, mb)
	if !ok {
		return
	}
	defer cl.Close()
	n := 1 + c.r.IntN(3)
	if exists > 40 {
		n = 10 // keep mailboxes small over a long run
	}
	targets := c.pickTargets(v, n)
	if len(targets) == 0 {
		return
	}
	op := c.rec.Begin(c.id, node, history.Expunge)
	op.Mailbox, op.Targets = history.Mailbox{User: user, Name: mb}, targets
	op.View = &history.View{UIDValidity: v.UIDValidity} // the UIDs' space
	if _, err := cl.Command("UID STORE "+uidList(targets)+` +FLAGS.SILENT (\Deleted)`, 1<<16, nil); err != nil {
		c.rec.End(op, history.Failed, fmt.Errorf("UID STORE \\Deleted: %w", err)) // no EXPUNGE was sent
		return
	}
	_, err := cl.Command("UID EXPUNGE "+uidList(targets), 1<<16, nil)
	c.rec.End(op, outcomeOf(err), err)
	_, _ = cl.Command("LOGOUT", 1<<16, nil)
}

// move moves 1 or 2 messages from INBOX to Archive with UID MOVE (RFC
// 6851), recording COPYUID.
func (c *robustClient) move(ctx context.Context) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	user := c.user()
	cl, node, v, _, ok := c.listed(ctx, user, "INBOX")
	if !ok {
		return
	}
	defer cl.Close()
	targets := c.pickTargets(v, 1+c.r.IntN(2))
	if len(targets) == 0 {
		return
	}
	op := c.rec.Begin(c.id, node, history.Move)
	op.Mailbox, op.Dest, op.Targets = history.Mailbox{User: user, Name: "INBOX"}, "Archive", targets
	op.View = &history.View{UIDValidity: v.UIDValidity}
	copyUID := func(text string) {
		name, args, ok := loadgen.ResponseCode(text)
		if !ok || name != "COPYUID" || len(args) != 3 {
			return
		}
		val, _ := strconv.ParseUint(args[0], 10, 32)
		src, err1 := loadgen.ParseUIDSet(args[1])
		dst, err2 := loadgen.ParseUIDSet(args[2])
		if err1 != nil || err2 != nil || len(src) != len(dst) {
			return
		}
		op.DestValidity = uint32(val)
		for i := range src {
			op.Moved = append(op.Moved, history.UIDPair{From: src[i], To: dst[i]})
		}
	}
	text, err := cl.Command("UID MOVE "+uidList(op.Targets)+" Archive", 1<<16, func(r *loadgen.IMAPResponse) error {
		if t, ok := strings.CutPrefix(string(r.Lines[0]), "* OK "); ok {
			copyUID(t) // RFC 6851 section 4.3: COPYUID in an untagged OK
		}
		return nil
	})
	if err == nil && op.Moved == nil {
		copyUID(text)
	}
	c.rec.End(op, outcomeOf(err), err)
	_, _ = cl.Command("LOGOUT", 1<<16, nil)
}

// idle selects INBOX, waits in IDLE for a change (at most 3 s), and lists
// the mailbox after it: a read that exercises change notification.
func (c *robustClient) idle(ctx context.Context) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	user := c.user()
	cl, node, err := c.imapSession(ctx, user)
	op := c.rec.Begin(c.id, node, history.Idle)
	op.Mailbox = history.Mailbox{User: user, Name: "INBOX"}
	if err != nil {
		c.rec.End(op, history.Failed, err)
		return
	}
	defer cl.Close()
	v, _, err := selectAndList(cl, "INBOX", false)
	if err != nil {
		c.rec.End(op, history.Failed, err)
		return
	}
	_, err = cl.Idle(3*time.Second, 1<<16, func(r *loadgen.IMAPResponse) (bool, error) {
		line := string(r.Lines[0])
		return strings.HasSuffix(line, "EXISTS") || strings.HasSuffix(line, "EXPUNGE") || strings.Contains(line, "FETCH"), nil
	})
	if err == nil {
		err = listInto(cl, v, false)
	}
	if err == nil {
		op.View = v
	}
	c.rec.End(op, readOutcome(err), err)
	_, _ = cl.Command("LOGOUT", 1<<16, nil)
}

// readOutcome: a read changes nothing, so an error is simply Failed.
func readOutcome(err error) history.Outcome {
	if err != nil {
		return history.Failed
	}
	return history.Ok
}

// read lists INBOX or Archive, or asks STATUS for HIGHESTMODSEQ.
func (c *robustClient) read(ctx context.Context) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	user := c.user()
	mb := "INBOX"
	if c.r.IntN(3) == 0 {
		mb = "Archive"
	}
	cl, node, err := c.imapSession(ctx, user)
	op := c.rec.Begin(c.id, node, history.Read)
	op.Mailbox = history.Mailbox{User: user, Name: mb}
	if err != nil {
		c.rec.End(op, history.Failed, err)
		return
	}
	defer cl.Close()
	if c.r.IntN(3) == 0 {
		v := &history.View{}
		_, err = cl.Command("STATUS "+mb+" (UIDVALIDITY HIGHESTMODSEQ)", 1<<16, func(r *loadgen.IMAPResponse) error {
			f := strings.Fields(strings.NewReplacer("(", " ", ")", " ").Replace(string(r.Lines[0])))
			for i := 0; i+1 < len(f); i++ {
				switch strings.ToUpper(f[i]) {
				case "UIDVALIDITY":
					u, _ := strconv.ParseUint(f[i+1], 10, 32)
					v.UIDValidity = uint32(u)
				case "HIGHESTMODSEQ":
					v.HighestModSeq, _ = strconv.ParseUint(f[i+1], 10, 63)
				}
			}
			return nil
		})
		if err == nil {
			op.View = v
		}
	} else {
		op.View, _, err = selectAndList(cl, mb, false)
	}
	c.rec.End(op, readOutcome(err), err)
	_, _ = cl.Command("LOGOUT", 1<<16, nil)
}

// dele opens the user's maildrop over POP3, learns the tokens of 1 to 3
// random messages with TOP, marks them with DELE and QUITs.
func (c *robustClient) dele(ctx context.Context) {
	user := c.user()
	node, addrs := c.nodes.pick(c.r)
	op := c.rec.Begin(c.id, node, history.Dele)
	op.Mailbox = history.Mailbox{User: user, Name: "INBOX"}
	deadline := time.Now().Add(robustOpTimeout)
	tc, err := dialTextUntil(addrs["pop3"], deadline)
	if err != nil {
		c.rec.End(op, history.Failed, err)
		return
	}
	p := &POP3Client{c: tc}
	defer p.Close()
	for _, line := range []string{"", "USER " + user, "PASS " + c.passwords[user]} {
		if _, err := p.cmd(line); err != nil {
			c.rec.End(op, history.Failed, err) // [IN-USE] included
			return
		}
	}
	n, _, err := p.Stat()
	if err != nil {
		c.rec.End(op, history.Failed, err)
		return
	}
	want := 1 + c.r.IntN(3)
	if n > 40 {
		want = 10
	}
	for _, i := range c.r.Perm(n) {
		if len(op.Targets) == want {
			break
		}
		hdr, err := p.multi(fmt.Sprintf("TOP %d 0", i+1))
		if err != nil {
			c.rec.End(op, history.Failed, err) // no QUIT: nothing deleted
			return
		}
		tok, ok := loadgen.HeaderValue(loadgen.StripTrace(hdr), historyHeader)
		if !ok {
			continue
		}
		if _, err := p.cmd(fmt.Sprintf("DELE %d", i+1)); err != nil {
			c.rec.End(op, history.Failed, err)
			return
		}
		op.Targets = append(op.Targets, history.Target{Token: tok})
	}
	if len(op.Targets) == 0 {
		c.rec.End(op, history.Failed, errors.New("nothing to delete"))
		return
	}
	_, err = p.cmd("QUIT")
	var perr *POP3Error
	switch {
	case err == nil:
		c.rec.End(op, history.Ok, nil)
	case errors.As(err, &perr):
		// RFC 1939 section 6: -ERR in UPDATE means some deletions may
		// not have been made.
		c.rec.End(op, history.Ambiguous, err)
	default:
		c.rec.End(op, history.Ambiguous, err)
	}
}

// finalRead lists every message of mb with its body through node: one
// read of the final state.
func finalRead(ctx context.Context, rec *history.Recorder, node string, addrs map[string]string, user, password, mb string) (*history.Op, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*robustOpTimeout)
	defer cancel()
	op := rec.Begin(-1, node, history.Read)
	op.Mailbox, op.Final = history.Mailbox{User: user, Name: mb}, true
	cl, err := loadgen.DialIMAP(ctx, nil, addrs["imap"], 2*robustOpTimeout)
	if err == nil {
		defer cl.Close()
		err = cl.Login(user, password)
	}
	if err == nil {
		_, err = cl.Command("ENABLE CONDSTORE", 1<<16, nil)
	}
	var v *history.View
	if err == nil {
		v, _, err = selectAndList(cl, mb, true)
	}
	if err != nil {
		rec.End(op, history.Failed, err)
		return op, err
	}
	op.View = v
	rec.End(op, history.Ok, nil)
	return op, nil
}
