package loadgen

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMixKindExactAndSpread(t *testing.T) {
	for _, pm := range []uint64{0, 1, 100, 333, 500, 999, 1000} {
		m := Mix{POP3PerMille: pm}
		// Any window of 1000 consecutive transactions holds exactly pm.
		for _, start := range []uint64{0, 1, 517, 1 << 40, 1<<64 - 3000} {
			n := uint64(0)
			for i := start; i < start+1000; i++ {
				if m.Kind(i) == TxPOP3 {
					n++
				}
			}
			if n != pm {
				t.Errorf("per mille %d from %d: %d POP3 in 1000", pm, start, n)
			}
		}
		// Evenly spread: the gap between POP3 transactions never exceeds
		// ceil(1000/pm), so they cannot bunch up at one end of a window.
		if pm == 0 {
			continue
		}
		maxGap := (1000 + pm - 1) / pm
		last := uint64(0)
		seen := false
		for i := uint64(0); i < 5000; i++ {
			if m.Kind(i) != TxPOP3 {
				continue
			}
			if seen && i-last > maxGap {
				t.Errorf("per mille %d: gap %d between POP3 transactions %d and %d", pm, i-last, last, i)
			}
			last, seen = i, true
		}
	}
}

func TestSampleMailboxes(t *testing.T) {
	users := UserNames("example.test", 100)
	got := SampleMailboxes(users, 6)
	want := []string{users[0], users[1], users[2], users[3], users[35], users[67]}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("SampleMailboxes = %v, want %v", got, want)
	}
	if got := SampleMailboxes(users[:3], 10); len(got) != 3 {
		t.Errorf("sample of 10 from 3 users: %v", got)
	}
}

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses, as proc(5) allows.
	line := []byte("4242 (a (b) c) S 17 4242 4242 0 -1 4194560 1 0 0 0 250 50 7 3 20 0 1 0 100 0 0\n")
	s, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if s.pid != 4242 || s.ppid != 17 || s.ticks != 310 {
		t.Errorf("parsed %+v, want pid 4242 ppid 17 ticks 310", s)
	}
	for _, bad := range []string{"", "1 (x", "x (y) S 1 2 3", "1 (y) S 1 2 3 4 5 6 7 8 9 10 11 12 13", "1 (y) S z 2 3 4 5 6 7 8 9 10 a b c d e"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q) succeeded", bad)
		}
	}
	self, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc on this system")
	}
	if s, err := parseProcStat(self); err != nil || s.pid != os.Getpid() {
		t.Errorf("own stat: %+v, %v", s, err)
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 5 6 7 8 20 0 1 0 100 0 0"))
	f.Add([]byte("2 ()) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseProcStat(b)
		if err == nil && !bytes.Contains(b, []byte(")")) {
			t.Fatalf("parsed %+v from a line without a command name", s)
		}
	})
}

func TestTreeCPU(t *testing.T) {
	procs := map[int]procStat{
		1:  {pid: 1, ppid: 0, ticks: 1000},
		10: {pid: 10, ppid: 1, ticks: 100}, // the server's master
		11: {pid: 11, ppid: 10, ticks: 20},
		12: {pid: 12, ppid: 10, ticks: 30},
		13: {pid: 13, ppid: 12, ticks: 5},
		20: {pid: 20, ppid: 1, ticks: 700}, // someone else
	}
	d, ok := treeCPU(procs, 10)
	if !ok || d != 1550*time.Millisecond {
		t.Errorf("treeCPU = %v, %v; want 1.55s", d, ok)
	}
	if _, ok := treeCPU(procs, 99); ok {
		t.Error("treeCPU of a missing root succeeded")
	}
}

// mixAgainst runs the mix against s with a small population, a delivery
// sample and a prober.
func mixAgainst(t *testing.T, s *fakeServer, mut func(*MixConfig)) MixSummary {
	t.Helper()
	users := UserNames("example.test", 20)
	probes := []string{"probe0@example.test", "probe1@example.test"}
	for _, u := range append(append([]string(nil), users...), probes...) {
		s.passwords[u] = "mix-password"
	}
	z, err := NewZipf(users, 1)
	if err != nil {
		t.Fatal(err)
	}
	s.start()
	cfg := MixConfig{
		SMTPAddr: s.smtpLn.Addr().String(),
		POP3Addr: s.pop3Ln.Addr().String(),
		Spec: Spec{
			Seed: 9, RunID: "mix", From: "loadgen@quill-load.invalid",
			Sizes: DefaultLogNormal, Rcpts: z,
		},
		Password:     "mix-password",
		Mix:          Mix{POP3PerMille: 100},
		Clients:      4,
		Duration:     400 * time.Millisecond,
		Probes:       probes,
		Sample:       SampleMailboxes(users, 6),
		DrainTimeout: 5 * time.Second,
		Processes:    map[string]int{"self": os.Getpid()},
		Timeout:      10 * time.Second,
	}
	if mut != nil {
		mut(&cfg)
	}
	sum, err := RunMix(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestRunMixMeasuresDelivery runs the mix against a server that pipelines
// POP3 and one that does not, which fails the test if the client pipelines
// anyway.
func TestRunMixMeasuresDelivery(t *testing.T) {
	for _, pipelining := range []bool{true, false} {
		t.Run(map[bool]string{true: "pipelining", false: "lock-step"}[pipelining], func(t *testing.T) {
			s := newFakeServer(t)
			s.noPipe = !pipelining
			checkMix(t, s, mixAgainst(t, s, nil))
		})
	}
}

func checkMix(t *testing.T, s *fakeServer, sum MixSummary) {
	t.Helper()
	if sum.SMTP.Acked == 0 || sum.SMTP.Rejected+sum.SMTP.NoReply != 0 {
		t.Fatalf("smtp: %+v", sum.SMTP)
	}
	// Exactly one transaction in ten is a POP3 session.
	total := sum.SMTP.Attempted + sum.POP3.Sessions
	if want := total / 10; sum.POP3.Sessions < want-1 || sum.POP3.Sessions > want+1 {
		t.Errorf("%d POP3 sessions of %d transactions, want 10%%", sum.POP3.Sessions, total)
	}
	if sum.POP3.Failed != 0 || sum.POP3.Retrieved == 0 {
		t.Errorf("pop3: %+v", sum.POP3)
	}
	d := sum.Delivery
	if !d.Measured || !d.DrainComplete || d.Missing != 0 || d.VisibleAtEnd != 1 || d.SampleAcked == 0 {
		t.Errorf("the fake server stores at once, yet delivery = %+v", d)
	}
	if d.MsgPerSec != sum.SMTP.MsgPerSec {
		t.Errorf("delivered %.1f msg/s != accepted %.1f msg/s", d.MsgPerSec, sum.SMTP.MsgPerSec)
	}
	if sum.E2E.Probes == 0 || sum.E2E.Lost != 0 || sum.E2E.Latency.P50 <= 0 {
		t.Errorf("e2e: %+v", sum.E2E)
	}
	// The prober samples: a probe at most every probeInterval (sent back to
	// back, the fake server took hundreds in the run).
	if most := int64(400*time.Millisecond/(100*time.Millisecond)) + 1; sum.E2E.Probes > most {
		t.Errorf("%d probes in 400 ms, want at most %d", sum.E2E.Probes, most)
	}
	if c, ok := sum.CPU["self"]; !ok || c.Total <= 0 || c.PerDelivered <= 0 {
		t.Errorf("cpu: %+v", sum.CPU)
	}
	// The drain emptied the sampled mailboxes of this run's messages.
	for _, mb := range SampleMailboxes(UserNames("example.test", 20), 6) {
		if n := len(s.box(mb)); n != 0 {
			t.Errorf("%s still holds %d messages after the drain", mb, n)
		}
	}
	var buf bytes.Buffer
	if err := sum.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "delivered msg/s") {
		t.Errorf("table: %v\n%s", err, buf.String())
	}
	if _, err := json.Marshal(sum); err != nil {
		t.Error(err)
	}
}

// A server that acknowledges but never makes mail visible must not look
// fast: its delivered rate is zero however fast it acknowledges.
func TestRunMixQueueingServerDeliversNothing(t *testing.T) {
	s := newFakeServer(t)
	s.hold = true
	sum := mixAgainst(t, s, func(c *MixConfig) {
		c.Probes = nil
		c.DrainTimeout = 300 * time.Millisecond
	})
	d := sum.Delivery
	if sum.SMTP.Acked == 0 || d.SampleAcked == 0 {
		t.Fatalf("nothing acknowledged: %+v", sum.SMTP)
	}
	if d.MsgPerSec != 0 || d.VisibleAtEnd != 0 || d.DrainComplete || d.Missing != d.SampleAcked {
		t.Errorf("delivery of a server that never delivers: %+v", d)
	}
}

func TestRunMixOpenLoopPacing(t *testing.T) {
	s := newFakeServer(t)
	sum := mixAgainst(t, s, func(c *MixConfig) {
		c.Rate = 200
		c.Duration = 500 * time.Millisecond
		c.Probes = nil
	})
	started := sum.SMTP.Attempted + sum.POP3.Sessions
	// 100 transactions fall due; a fast server starts them all.
	if started+sum.Unstarted != 100 || started < 90 {
		t.Errorf("open loop at 200/s for 0.5s: %d started, %d unstarted, want 100", started, sum.Unstarted)
	}
	if sum.Mode != "open" || sum.OfferedRate != 200 {
		t.Errorf("mode %q rate %v", sum.Mode, sum.OfferedRate)
	}
}

func TestSaturateStopsAtTheBound(t *testing.T) {
	s := newFakeServer(t)
	users := UserNames("example.test", 5)
	for _, u := range users {
		s.passwords[u] = "pw-pw-pw-pw"
	}
	s.start()
	base := MixConfig{
		SMTPAddr: s.smtpLn.Addr().String(),
		POP3Addr: s.pop3Ln.Addr().String(),
		Spec:     Spec{Seed: 1, RunID: "sat", From: "l@quill-load.invalid", Sizes: FixedSize(2000), Rcpts: Uniform{Users: users}},
		Password: "pw-pw-pw-pw",
		Clients:  1,
		Timeout:  10 * time.Second,
	}
	// One client of a server that takes ~0.1-1 ms per transaction cannot
	// meet 100,000 tx/s: the search passes the low rates and stops there.
	res, err := Saturate(t.Context(), base, SaturationConfig{
		StartRate: 50, Factor: 50, Step: 200 * time.Millisecond,
		Bound: time.Second, MaxShare: 0.05, MaxSteps: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	n := len(res.Steps)
	if n < 2 || !res.Steps[0].Passed || res.Steps[n-1].Passed {
		t.Fatalf("steps: %+v", res.Steps)
	}
	if res.PeakRate != res.Steps[n-2].Rate || res.PeakStep != n-2 || res.PeakDelivered <= 0 {
		t.Errorf("peak %v (step %d, %v delivered), steps %+v", res.PeakRate, res.PeakStep, res.PeakDelivered, res.Steps)
	}

	// Refinement: each further step offers the geometric mean of the
	// highest rate that passed and the lowest that failed so far.
	res, err = Saturate(t.Context(), base, SaturationConfig{
		StartRate: 50, Factor: 50, Step: 200 * time.Millisecond,
		Bound: time.Second, MaxShare: 0.05, MaxSteps: 5, Refine: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	climb := 0
	for climb < len(res.Steps) && res.Steps[climb].Passed {
		climb++
	}
	if climb == 0 || climb == len(res.Steps) || len(res.Steps) != climb+1+3 {
		t.Fatalf("want a climb, one failure and 3 refinements: %+v", res.Steps)
	}
	pass, fail := res.Steps[climb-1].Rate, res.Steps[climb].Rate
	for i, st := range res.Steps[climb+1:] {
		if want := math.Sqrt(pass * fail); math.Abs(st.Rate-want) > 1e-9*want {
			t.Errorf("refinement %d offered %v, want %v (between %v and %v)", i, st.Rate, want, pass, fail)
		}
		if st.Passed {
			pass = st.Rate
		} else {
			fail = st.Rate
		}
	}
	if res.PeakRate != pass || res.Steps[res.PeakStep].Rate != pass || !res.Steps[res.PeakStep].Passed {
		t.Errorf("peak %v at step %d, want the highest pass %v: %+v", res.PeakRate, res.PeakStep, pass, res.Steps)
	}

	// A bound nothing meets: the first step fails and there is nothing
	// to refine.
	res, err = Saturate(t.Context(), base, SaturationConfig{
		StartRate: 50, Factor: 2, Step: 200 * time.Millisecond,
		Bound: time.Nanosecond, MaxShare: 0.05, MaxSteps: 5, Refine: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 1 || res.Steps[0].Passed || res.PeakStep != -1 || res.PeakRate != 0 {
		t.Errorf("unmeetable bound: peak %v at step %d, steps %+v", res.PeakRate, res.PeakStep, res.Steps)
	}

	// With retries the failing rate is run again before the climb ends.
	res, err = Saturate(t.Context(), base, SaturationConfig{
		StartRate: 50, Factor: 2, Step: 200 * time.Millisecond,
		Bound: time.Nanosecond, MaxShare: 0.05, MaxSteps: 5, Refine: 3, Retries: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 3 || res.PeakStep != -1 {
		t.Fatalf("unmeetable bound, 2 retries: want 3 failed steps at 50/s, got %+v", res.Steps)
	}
	for _, st := range res.Steps {
		if st.Rate != 50 || st.Passed {
			t.Errorf("step %+v: want a failure at 50/s", st)
		}
	}
	// A failure put down to the machine is run again, up to MaxDisturbed
	// times, and does not use up Retries; the callback sees the step's span.
	var spans []time.Duration
	res, err = Saturate(t.Context(), base, SaturationConfig{
		StartRate: 50, Factor: 2, Step: 200 * time.Millisecond,
		Bound: time.Nanosecond, MaxShare: 0.05, MaxSteps: 5, MaxDisturbed: 2,
		Disturbed: func(start, end time.Time) string {
			spans = append(spans, end.Sub(start))
			return "the disk stalled"
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 3 || res.PeakStep != -1 || len(spans) != 2 {
		t.Fatalf("unmeetable bound, 2 disturbed reruns: want 3 failed steps and 2 calls, got %d calls, %+v", len(spans), res.Steps)
	}
	for i, st := range res.Steps {
		want := ""
		if i < 2 {
			want = "the disk stalled"
		}
		if st.Rate != 50 || st.Passed || st.Disturbed != want {
			t.Errorf("step %d %+v: want a failure at 50/s, disturbed %q", i, st, want)
		}
	}
	for i, d := range spans {
		if run := res.Steps[i].Summary.Elapsed; d < run {
			t.Errorf("Disturbed saw a span of %v, shorter than the step's run of %v", d, run)
		}
	}
	// A failure the callback does not explain ends the climb as before.
	res, err = Saturate(t.Context(), base, SaturationConfig{
		StartRate: 50, Factor: 2, Step: 200 * time.Millisecond,
		Bound: time.Nanosecond, MaxShare: 0.05, MaxSteps: 5, MaxDisturbed: 2,
		Disturbed: func(time.Time, time.Time) string { return "" },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 1 || res.Steps[0].Disturbed != "" {
		t.Errorf("undisturbed failure: want one step, got %+v", res.Steps)
	}
	if _, err := Saturate(t.Context(), base, SaturationConfig{StartRate: 1, Factor: 1, Step: time.Second, Bound: time.Second}); err == nil {
		t.Error("factor 1 accepted")
	}
}

// TestRunMixOneMessagePerConn: with MessagesPerConn 1 the mix connects,
// greets, sends one message and quits for every SMTP transaction, and the
// summary accounts for the whole machine's CPU.
func TestRunMixOneMessagePerConn(t *testing.T) {
	s := newFakeServer(t)
	sum := mixAgainst(t, s, func(c *MixConfig) { c.MessagesPerConn = 1 })
	checkMix(t, s, sum)
	conns, quits := s.smtpSessions()
	// The prober sends over connections of its own.
	if sum.SMTP.Connections != sum.SMTP.Attempted || int64(conns) < sum.SMTP.Attempted || quits < int(sum.SMTP.Attempted) {
		t.Errorf("%d transactions over %d connections (server: %d accepted, %d quit)", sum.SMTP.Attempted, sum.SMTP.Connections, conns, quits)
	}
	m := sum.Machine
	if m == nil || m.CPUs <= 0 || m.Busy <= 0 || m.Servers != sum.CPU["self"].Load || m.OtherShare < 0 || m.OtherShare > 1 {
		t.Errorf("machine: %+v", m)
	}
}

func TestPollGap(t *testing.T) {
	for _, c := range []struct{ elapsed, want time.Duration }{
		{0, time.Millisecond},
		{5 * time.Millisecond, time.Millisecond},
		{50 * time.Millisecond, 5 * time.Millisecond},
		{time.Second, 100 * time.Millisecond},
	} {
		if got := pollGap(c.elapsed); got != c.want {
			t.Errorf("pollGap(%v) = %v, want %v", c.elapsed, got, c.want)
		}
	}
}
