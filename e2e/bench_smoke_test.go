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
	sum, err := loadgen.RunMix(t.Context(), loadgen.MixConfig{
		SMTPAddr:     s.Addr("smtp"),
		POP3Addr:     s.Addr("pop3"),
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
	})
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	_ = sum.WriteTable(&table)
	t.Logf("mix against quill:\n%s", table.String())
	if sum.SMTP.Acked == 0 || sum.SMTP.Rejected != 0 || sum.SMTP.NoReply != 0 {
		t.Errorf("smtp: %d acked, %d rejected %v, %d no reply %v", sum.SMTP.Acked, sum.SMTP.Rejected, sum.SMTP.RejectCodes, sum.SMTP.NoReply, sum.SMTP.Errors)
	}
	if sum.POP3.Sessions == 0 || sum.POP3.Failed != 0 {
		t.Errorf("pop3: %d sessions, %d failed", sum.POP3.Sessions, sum.POP3.Failed)
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
