package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// maxRetrieved bounds one retrieved message: the largest we generate plus
// room for any server's trace fields.
const maxRetrieved = maxGenSize + 1<<20

// errInUse is a POP3 login refused because another session holds the
// maildrop (RFC 2449 section 8.1.2, [IN-USE]): a legitimate answer under a
// skewed mix, counted apart from failures.
var errInUse = errors.New("loadgen: maildrop in use")

// pop3Result is what one retrieval session (POP3 or IMAP) did.
type pop3Result struct {
	err     error
	loginAt time.Time     // when the login reply arrived (PASS, LOGIN)
	login   time.Duration // connect to login reply
	msgs    int64         // retrieved and deleted (after QUIT +OK, EXPUNGE OK)
	bytes   int64
	runMsgs int64 // of msgs, those whose id starts with the run's prefix
	foundID bool  // a message with the wanted id was among them
}

// pop3Window bounds the commands a pipelining session sends ahead of
// their replies: 32 messages' RETR and DELE, a few hundred octets, far
// below any socket buffer, so neither side can block the other's writes.
const pop3Window = 64

// pop3Session logs in as user, retrieves and deletes every message, and
// quits (RFC 1939: STAT, RETR, DELE, QUIT; the deletions take effect in the
// UPDATE state). Counts are reported only when QUIT succeeds, since until
// then nothing was deleted.
//
// It asks for CAPA first and, when the server lists PIPELINING (RFC 2449
// section 6.6), sends USER, PASS and STAT in one write and then RETR and
// DELE for up to pop3Window/2 messages per write, as a client that
// pipelines SMTP does; otherwise one command at a time. QUIT always waits
// for every earlier reply: a failed RETR ends the session without it, so
// nothing is deleted unread.
func pop3Session(ctx context.Context, cfg *MixConfig, user, idPfx, wantID string) (res pop3Result) {
	t0 := time.Now()
	conn, err := cfg.Dialer.DialContext(ctx, "tcp", cfg.POP3Addr)
	if err != nil {
		res.err = fmt.Errorf("pop3 dial: %w", err)
		return res
	}
	defer conn.Close()
	defer watch(ctx, conn)()
	p := &pop3Conn{newLineConn(ctx, conn, cfg.Timeout)}
	if _, err := p.status(); err != nil {
		res.err = fmt.Errorf("pop3 greeting: %w", err)
		return res
	}
	window := 1
	if p.pipelining() {
		window = pop3Window
	}
	var count int
	login := [...]string{"USER " + user, "PASS " + cfg.Password, "STAT"}
	err = p.pipeline(len(login), window, func(k int) string { return login[k] }, func(k int, status string) error {
		switch k {
		case 1:
			res.loginAt = time.Now()
		case 2:
			n, err := parseStat(status)
			count = n
			return err
		}
		return nil
	})
	if err != nil {
		if strings.Contains(err.Error(), "[IN-USE]") {
			err = fmt.Errorf("pop3 PASS: %w", errInUse)
		}
		res.err = err
		return res
	}
	res.login = res.loginAt.Sub(t0)
	var msg []byte
	var msgs, bytes, runMsgs int64
	found := false
	// Command k is RETR k/2+1 for even k and DELE k/2+1 for odd k.
	err = p.pipeline(2*count, window, func(k int) string {
		if k%2 == 1 {
			return "DELE " + strconv.Itoa(k/2+1)
		}
		return "RETR " + strconv.Itoa(k/2+1)
	}, func(k int, _ string) error {
		if k%2 == 1 {
			return nil
		}
		var err error
		if msg, err = readMultiline(p.r, msg[:0], maxRetrieved); err != nil {
			return err
		}
		msgs++
		bytes += int64(len(msg))
		if id, ok := HeaderValue(StripTrace(msg), IDHeader); ok && strings.HasPrefix(id, idPfx) {
			runMsgs++
			found = found || id == wantID
		}
		return nil
	})
	if err != nil {
		res.err = err
		return res
	}
	if _, err := p.cmd("QUIT"); err != nil {
		res.err = fmt.Errorf("pop3 QUIT: %w", err)
		return res
	}
	res.msgs, res.bytes, res.runMsgs, res.foundID = msgs, bytes, runMsgs, found
	return res
}

// pop3Stats is one worker's share of the POP3 figures.
type pop3Stats struct {
	sessions, failed, inUse, msgs, bytes int64
	lat, login                           histogram
}

func (s *pop3Stats) add(res pop3Result, lat time.Duration) {
	s.sessions++
	switch {
	case errors.Is(res.err, errInUse):
		s.inUse++
		return
	case res.err != nil:
		s.failed++
		return
	}
	s.msgs += res.msgs
	s.bytes += res.bytes
	s.lat.record(lat)
	s.login.record(res.login)
}

// prober measures end-to-end delivery latency, one message at a time: it
// sends a message to a probe mailbox and logs in until the message is
// there. The latency is from the SMTP acknowledgement to the login reply
// (POP3 PASS, IMAP LOGIN) of the session that found it, so it includes at
// most one login too many (reported as the login latency).
//
// It samples, and must not be a load of its own: a probe starts at most
// every probeInterval, and a login that does not find the message is
// followed by the next only after pollGap. Sent back to back, with logins
// back to back, the probes of a server with a 2 ms latency were about 140
// messages and 200 logins a second, outside the delivered count but inside
// the server's CPU: at 100 msg/s offered most of the server's work.
type prober struct {
	run  *mixRun
	gen  *Generator
	seq  uint64
	e2e  histogram
	sent int64
	lost int64 // acknowledged but not visible within the timeout
	errs int64
}

// probeSeqBase keeps probe message ids apart from the mix's.
const probeSeqBase = 1 << 62

// probeTimeout is how long one probe may take to become visible.
const probeTimeout = 30 * time.Second

// probeInterval is the least time from the start of one probe to the start
// of the next: at most 10 samples a second.
const probeInterval = 100 * time.Millisecond

// pollGap is the wait after a login that did not find a probe sent elapsed
// ago: a tenth of that, at least a millisecond. The latency is then known to
// within 10% (or 1 ms), and a probe visible after time T costs about
// 10 + 10·ln(T/10 ms) logins: 10 at 10 ms, 50 at 500 ms.
func pollGap(elapsed time.Duration) time.Duration {
	return max(time.Millisecond, elapsed/10)
}

func newProber(r *mixRun) *prober {
	spec := r.cfg.Spec
	spec.Rcpts = &roundRobin{users: r.cfg.Probes}
	gen, _ := NewGenerator(spec) // spec was validated with a different picker only
	return &prober{run: r, gen: gen, seq: probeSeqBase}
}

// roundRobin picks the users in turn; it is owned by one goroutine.
type roundRobin struct {
	users []string
	next  int
}

func (rr *roundRobin) Pick(_ *rand.Rand, dst []string) []string {
	u := rr.users[rr.next%len(rr.users)]
	rr.next++
	return append(dst, u)
}

func (p *prober) loop() {
	cfg, ctx := p.run.cfg, p.run.ctx
	var c *smtpClient
	defer func() {
		if c != nil {
			c.quit()
		}
	}()
	var next time.Time // when the next probe may start
	for ctx.Err() == nil && time.Now().Before(p.run.stopAt) {
		if !waitUntil(ctx, next) || !time.Now().Before(p.run.stopAt) {
			return
		}
		next = time.Now().Add(probeInterval)
		if c == nil {
			var err error
			if c, err = dialSMTP(ctx, cfg.Dialer, cfg.SMTPAddr, cfg.Helo, cfg.Timeout); err != nil {
				p.errs++
				if !backoff(ctx, 1) {
					return
				}
				continue
			}
		}
		m := p.gen.Next(p.seq)
		p.seq++
		mb, id := m.Rcpts[0], m.ID()
		res := c.send(m, cfg.Spec.From)
		acked := time.Now()
		if c.broken {
			c.close()
			c = nil
		}
		if res.outcome != Acked {
			p.errs++
			continue
		}
		p.sent++
		deadline := acked.Add(probeTimeout)
		for {
			r := p.run.retrieve(mb, id)
			if r.err == nil && r.foundID {
				p.e2e.record(r.loginAt.Sub(acked))
				break
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				p.lost++
				break
			}
			if r.err != nil && !errors.Is(r.err, errInUse) {
				p.errs++
				backoff(ctx, 1) // a failing server must not be hammered
			} else if !waitUntil(ctx, time.Now().Add(pollGap(time.Since(acked)))) {
				p.lost++
				break
			}
		}
	}
}
