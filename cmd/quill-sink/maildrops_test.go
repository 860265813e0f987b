package main

import (
	"bytes"
	"fmt"
	"net/smtp"
	"net/textproto"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"quill/internal/loadgen"
)

const floorPassword = "floor-password"

// startFloor runs the mail floor on dir, with the extra args, and returns
// its SMTP and POP3 addresses and its stop function.
func startFloor(t *testing.T, dir string, extra ...string) (smtpAddr, pop3Addr string, stop func()) {
	t.Helper()
	addrs, stop := startSink(t, append([]string{"--durable", dir, "--pop3-addr", "127.0.0.1:0", "--password", floorPassword}, extra...)...)
	if addrs["pop3"] == "" {
		t.Fatalf("no pop3 listener in %v", addrs)
	}
	return addrs["smtp"], addrs["pop3"], stop
}

// fetch returns user's maildrop as the floor serves it, stored form.
func fetch(t *testing.T, pop3Addr, user string) []string {
	t.Helper()
	var msgs []string
	err := loadgen.FetchPOP3(t.Context(), loadgen.POP3Options{Addr: pop3Addr, User: user, Password: floorPassword, Timeout: 10 * time.Second},
		func(_ int, msg []byte) error {
			msgs = append(msgs, string(loadgen.StripTrace(msg)))
			return nil
		})
	if err != nil {
		t.Fatalf("fetching %s: %v", user, err)
	}
	return msgs
}

// pop3Session logs user in over a raw connection.
func pop3Session(t *testing.T, pop3Addr, user string) *textproto.Conn {
	t.Helper()
	c, err := textproto.Dial("tcp", pop3Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	pop3OK(t, c, "")
	pop3OK(t, c, "USER "+user)
	pop3OK(t, c, "PASS "+floorPassword)
	return c
}

// pop3OK sends cmd (none if empty) and requires a +OK status line.
func pop3OK(t *testing.T, c *textproto.Conn, cmd string) string {
	t.Helper()
	if cmd != "" {
		if err := c.PrintfLine("%s", cmd); err != nil {
			t.Fatal(err)
		}
	}
	line, err := c.ReadLine()
	if err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("%q: %q, %v", cmd, line, err)
	}
	return line
}

// TestMailFloorKeepsStateAcrossRestart: delivered mail is listed in order,
// an expunge acknowledged by QUIT stays done after a restart, the rest
// survives byte for byte, and the maildrop lock and the login hold.
func TestMailFloorKeepsStateAcrossRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "floor")
	smtpAddr, pop3Addr, stop := startFloor(t, dir)
	msg := func(i int) string { return fmt.Sprintf("Subject: m%d\r\n\r\nbody %d\r\n.leading dot\r\n", i, i) }
	for i := range 3 {
		if err := smtp.SendMail(smtpAddr, nil, "s@example.test", []string{"A@example.test"}, []byte(msg(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := smtp.SendMail(smtpAddr, nil, "s@example.test", []string{"a@example.test", "b@example.test"}, []byte(msg(3))); err != nil {
		t.Fatal(err)
	}
	if got, want := fetch(t, pop3Addr, "a@example.test"), []string{msg(0), msg(1), msg(2), msg(3)}; !equal(got, want) {
		t.Fatalf("a's maildrop %q, want %q", got, want)
	}

	c := pop3Session(t, pop3Addr, "a@example.test")
	err := loadgen.FetchPOP3(t.Context(), loadgen.POP3Options{Addr: pop3Addr, User: "a@example.test", Password: floorPassword}, ignore)
	if err == nil || !strings.Contains(err.Error(), "IN-USE") {
		t.Fatalf("second session on a locked maildrop: %v, want [IN-USE]", err)
	}
	pop3OK(t, c, "DELE 2")
	pop3OK(t, c, "DELE 4")
	pop3OK(t, c, "QUIT")
	err = loadgen.FetchPOP3(t.Context(), loadgen.POP3Options{Addr: pop3Addr, User: "b@example.test", Password: "wrong"}, ignore)
	if err == nil || !strings.Contains(err.Error(), "AUTH") {
		t.Fatalf("login with a wrong password: %v, want [AUTH]", err)
	}
	stop()

	_, pop3Addr, _ = startFloor(t, dir)
	if got, want := fetch(t, pop3Addr, "a@example.test"), []string{msg(0), msg(2)}; !equal(got, want) {
		t.Fatalf("after restart a's maildrop %q, want %q", got, want)
	}
	if got, want := fetch(t, pop3Addr, "b@example.test"), []string{msg(3)}; !equal(got, want) {
		t.Fatalf("after restart b's maildrop %q, want %q", got, want)
	}
	// A session that ends without QUIT expunges nothing.
	c = pop3Session(t, pop3Addr, "b@example.test")
	pop3OK(t, c, "DELE 1")
	c.Close()
	// The lock is released when the server sees the connection go; wait
	// for that by retrying the login, not by sleeping.
	for {
		err := loadgen.FetchPOP3(t.Context(), loadgen.POP3Options{Addr: pop3Addr, User: "b@example.test", Password: floorPassword}, ignore)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "IN-USE") {
			t.Fatal(err)
		}
	}
	if got := fetch(t, pop3Addr, "b@example.test"); len(got) != 1 {
		t.Fatalf("b's maildrop after a session without QUIT: %d messages, want 1", len(got))
	}
}

func ignore(int, []byte) error { return nil }

func equal(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

// TestMailFloorServesTheMix runs the benchmark's mix against the floor and
// the volatile floor: all acknowledged mail is retrieved, and the log each
// leaves is well formed, with every expunge naming messages delivered to
// its user.
func TestMailFloorServesTheMix(t *testing.T) {
	t.Run("durable", func(t *testing.T) { testFloorServesTheMix(t) })
	t.Run("volatile", func(t *testing.T) { testFloorServesTheMix(t, "--no-sync") })
}

func testFloorServesTheMix(t *testing.T, extra ...string) {
	dir := filepath.Join(t.TempDir(), "floor")
	smtpAddr, pop3Addr, stop := startFloor(t, dir, extra...)
	users := loadgen.UserNames("example.test", 6)
	z, err := loadgen.NewZipf(users, 1)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := loadgen.RunMix(t.Context(), loadgen.MixConfig{
		SMTPAddr:     smtpAddr,
		POP3Addr:     pop3Addr,
		Spec:         loadgen.Spec{Seed: 5, RunID: "floor", From: "loadgen@quill-load.invalid", Sizes: loadgen.DefaultLogNormal, Rcpts: z},
		Password:     floorPassword,
		Mix:          loadgen.Mix{POP3PerMille: 100},
		Clients:      4,
		Duration:     2 * time.Second,
		Probes:       []string{"probe00@example.test"},
		Sample:       loadgen.SampleMailboxes(users, 4),
		DrainTimeout: 30 * time.Second,
		Timeout:      30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	_ = sum.WriteTable(&table)
	t.Logf("mix against the mail floor:\n%s", table.String())
	if sum.SMTP.Acked == 0 || sum.SMTP.Rejected != 0 || sum.SMTP.NoReply != 0 {
		t.Errorf("smtp: %d acked, %d rejected, %d no reply %v", sum.SMTP.Acked, sum.SMTP.Rejected, sum.SMTP.NoReply, sum.SMTP.Errors)
	}
	if sum.POP3.Sessions == 0 || sum.POP3.Failed != 0 {
		t.Errorf("pop3: %d sessions, %d failed", sum.POP3.Sessions, sum.POP3.Failed)
	}
	if d := sum.Delivery; !d.Measured || d.SampleAcked == 0 || !d.DrainComplete || d.Missing != 0 || d.VisibleAtEnd != 1 {
		t.Errorf("delivery: %+v (acknowledged mail must be visible at once)", d)
	}
	if sum.E2E.Probes == 0 || sum.E2E.Lost != 0 {
		t.Errorf("e2e: %+v", sum.E2E)
	}
	stop()

	delivered := map[int64][]string{}
	expunges := 0
	for _, r := range readLog(t, filepath.Join(dir, logName)) {
		switch r.kind {
		case 'M':
			delivered[r.off] = r.users
		case 'X':
			expunges++
			for _, m := range r.recs {
				if !strings.Contains(strings.Join(delivered[m], "\x00"), r.users[0]) {
					t.Errorf("expunge at %d names message %d, not delivered to %s", r.off, m, r.users[0])
				}
			}
		}
	}
	if expunges == 0 {
		t.Error("no expunge record after a mix with retrieval")
	}
}
