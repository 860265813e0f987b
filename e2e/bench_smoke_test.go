package e2e

import (
	"bytes"
	"testing"
	"time"

	"quill/internal/loadgen"
)

// TestBenchMixSmoke runs a few seconds of the Porcupine mix (Zipf
// recipients, lognormal sizes, one POP3 session in ten, an end-to-end
// prober, a delivery sample and CPU accounting) against the real binary,
// so that the benchmark's generator never rots. Quill acknowledges only
// after a durable commit, so everything acknowledged must be visible the
// moment the load stops.
func TestBenchMixSmoke(t *testing.T) {
	benchMixSmoke(t, loadgen.RetrievalPOP3, "pop3")
}

// TestBenchMixSmokeIMAP is TestBenchMixSmoke with the retrieval sessions,
// the prober and the drain over IMAP (LOGIN on the plaintext loopback
// listener, which Quill allows).
func TestBenchMixSmokeIMAP(t *testing.T) {
	benchMixSmoke(t, loadgen.RetrievalIMAP, "imap")
}

// benchMixSmoke runs the 3 s mix against a fresh server, retrieving with
// the given protocol from its listener of that name, and checks it.
func benchMixSmoke(t *testing.T, retrieval, listener string) {
	s := startServer(t, Options{})
	const pw = "bench-smoke-password"
	users := loadgen.UserNames(s.Domain, 6)
	probes := []string{"probe00@" + s.Domain}
	for _, u := range append(append([]string(nil), users...), probes...) {
		addUser(t, s, u, pw)
	}
	z, err := loadgen.NewZipf(users, 1)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	pid := s.proc.Process.Pid
	s.mu.Unlock()
	cfg := loadgen.MixConfig{
		SMTPAddr:     s.Addr("smtp"),
		Retrieval:    retrieval,
		Spec:         loadgen.Spec{Seed: 4, RunID: "smoke", From: "loadgen@quill-load.invalid", Sizes: loadgen.DefaultLogNormal, Rcpts: z},
		Password:     pw,
		Mix:          loadgen.Mix{POP3PerMille: 100},
		Clients:      4,
		Duration:     3 * time.Second,
		Probes:       probes,
		Sample:       loadgen.SampleMailboxes(users, 4),
		DrainTimeout: 30 * time.Second,
		Processes:    map[string]int{"quill": pid},
		Timeout:      30 * time.Second,
	}
	if retrieval == loadgen.RetrievalIMAP {
		cfg.IMAPAddr = s.Addr(listener)
	} else {
		cfg.POP3Addr = s.Addr(listener)
	}
	sum, err := loadgen.RunMix(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	_ = sum.WriteTable(&table)
	t.Logf("mix against quill (%s):\n%s", retrieval, table.String())
	if sum.Retrieval != retrieval {
		t.Errorf("summary says retrieval %q, want %q", sum.Retrieval, retrieval)
	}
	if sum.SMTP.Acked == 0 || sum.SMTP.Rejected != 0 || sum.SMTP.NoReply != 0 {
		t.Errorf("smtp: %d acked, %d rejected %v, %d no reply %v", sum.SMTP.Acked, sum.SMTP.Rejected, sum.SMTP.RejectCodes, sum.SMTP.NoReply, sum.SMTP.Errors)
	}
	if sum.POP3.Sessions == 0 || sum.POP3.Failed != 0 {
		t.Errorf("%s: %d sessions, %d failed", retrieval, sum.POP3.Sessions, sum.POP3.Failed)
	}
	d := sum.Delivery
	if !d.Measured || d.SampleAcked == 0 || !d.DrainComplete || d.Missing != 0 || d.VisibleAtEnd != 1 {
		t.Errorf("delivery: %+v (acknowledged mail must be visible at once)", d)
	}
	if sum.E2E.Probes == 0 || sum.E2E.Lost != 0 {
		t.Errorf("e2e: %+v", sum.E2E)
	}
	if c := sum.CPU["quill"]; c.Total <= 0 || c.PerDelivered <= 0 {
		t.Errorf("cpu: %+v", c)
	}
}
