package loadgen

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func runAgainst(t *testing.T, s *fakeServer, cfg Config) (Summary, []*Record) {
	t.Helper()
	var ledger Ledger
	cfg.Addr = s.smtpLn.Addr().String()
	cfg.OnRecord = ledger.Add
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	sum, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sum, ledger.Records()
}

func verifyAll(t *testing.T, s *fakeServer, records []*Record, users []string) Report {
	t.Helper()
	pw := map[string]string{}
	for _, u := range users {
		s.passwords[u] = "secret-" + u
		pw[u] = "secret-" + u
	}
	rep, err := VerifyPOP3(t.Context(), records, POP3Options{Addr: s.pop3Ln.Addr().String(), Timeout: 10 * time.Second}, pw)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestRunDeliversAndVerifies(t *testing.T) {
	for _, pipelining := range []bool{true, false} {
		name := "pipelining"
		if !pipelining {
			name = "lockstep"
		}
		t.Run(name, func(t *testing.T) {
			s := newFakeServer(t)
			s.noPipe = !pipelining
			s.start()
			users := UserNames("example.test", 5)
			sum, records := runAgainst(t, s, Config{Spec: testSpec(3000, users), Concurrency: 4, Count: 200})
			if sum.Attempted != 200 || sum.Acked != 200 || len(records) != 200 {
				t.Fatalf("summary %+v, %d records", sum, len(records))
			}
			if sum.AckedBytes != 200*3000 || sum.Latency.P50 <= 0 || sum.Latency.P99 < sum.Latency.P50 || sum.MsgPerSec <= 0 {
				t.Fatalf("summary %+v", sum)
			}
			seqs := map[uint64]bool{}
			for _, r := range records {
				if r.Outcome != Acked || r.Code != 250 || r.Stage != StageDone || seqs[r.Seq] {
					t.Fatalf("record %+v", r)
				}
				seqs[r.Seq] = true
			}
			rep := verifyAll(t, s, records, users)
			if !rep.OK() || rep.Acked != 200 || rep.Present != 200 || rep.Foreign != 0 {
				t.Fatalf("report %s %v", rep.String(), rep.Missing)
			}
		})
	}
}

// TestRunRejectionResetsTransaction: a refused recipient is Rejected with
// its code, and the next transaction on the same connection starts clean
// (the fake server answers 503 to a nested MAIL, so a missing RSET would
// reject every later message).
func TestRunRejectionResetsTransaction(t *testing.T) {
	s := newFakeServer(t)
	users := UserNames("example.test", 3)
	s.rejectTo[users[1]] = 550
	s.start()
	sum, records := runAgainst(t, s, Config{Spec: testSpec(500, users), Concurrency: 1, Count: 60})
	rejected := 0
	for _, r := range records {
		switch {
		case r.Rcpts[0] == users[1]:
			if r.Outcome != Rejected || r.Code != 550 || r.Accepted[0] {
				t.Fatalf("record for refused rcpt: %+v", r)
			}
			rejected++
		case r.Outcome != Acked:
			t.Fatalf("record %+v", r)
		}
	}
	if rejected == 0 || sum.Rejected != int64(rejected) || sum.RejectCodes[550] != int64(rejected) {
		t.Fatalf("rejected %d, summary %+v", rejected, sum)
	}
	rep := verifyAll(t, s, records, users)
	if !rep.OK() || rep.Acked != 60-rejected || rep.Present != rep.Acked {
		t.Fatalf("report %s", rep.String())
	}
}

// TestRunConnectionDeath: a connection dropped before the final reply is
// NoReply, the worker reconnects, and such messages are never counted as
// acknowledged.
func TestRunConnectionDeath(t *testing.T) {
	s := newFakeServer(t)
	s.dieOnData = func(n int) bool { return n%7 == 0 }
	s.start()
	users := UserNames("example.test", 4)
	sum, records := runAgainst(t, s, Config{Spec: testSpec(2000, users), Concurrency: 3, Count: 100})
	noReply := 0
	for _, r := range records {
		if r.Outcome == NoReply {
			noReply++
			if r.Err == nil || r.Code != 0 || r.Stage != StageFinalReply {
				t.Fatalf("noreply record %+v", r)
			}
		}
	}
	if noReply != 14 || sum.NoReply != 14 || sum.Acked != 86 || sum.Errors["io"] != 14 {
		t.Fatalf("noreply %d, summary %+v", noReply, sum)
	}
	rep := verifyAll(t, s, records, users)
	if !rep.OK() || rep.Acked != 86 || rep.UnackedPresent != 0 {
		t.Fatalf("report %s", rep.String())
	}
}

// TestRunGivesUpWhenNoSessionStarts: a listener that hangs up at once (a
// server that is down, without the risk that another test reuses a freed
// port) makes every worker give up after maxDialFailures attempts.
func TestRunGivesUpWhenNoSessionStarts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	cfg := Config{Addr: ln.Addr().String(), Spec: testSpec(100, []string{"a@example.test"}), Concurrency: 2, Count: 10}
	sum, err := Run(t.Context(), cfg)
	if err != ErrAllWorkersFailed || sum.Errors["dial"] != 2*maxDialFailures || sum.Attempted != 0 {
		t.Fatalf("err %v, summary %+v", err, sum)
	}
}

// TestRunStopsOnCancel: cancelling the context from OnRecord ends the run
// promptly with the transactions counted so far.
func TestRunStopsOnCancel(t *testing.T) {
	s := newFakeServer(t)
	s.start()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var ledger Ledger
	cfg := Config{
		Addr: s.smtpLn.Addr().String(), Spec: testSpec(1000, UserNames("example.test", 2)), Concurrency: 4,
		OnRecord: func(r *Record) {
			ledger.Add(r)
			if r.Seq == 50 {
				cancel()
			}
		},
	}
	sum, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Messages 0-50 were all claimed before the cancel, but a worker that
	// was still connecting when it came drops the message it claimed
	// without attempting it: at most one per other worker.
	if sum.Attempted < int64(51-(cfg.Concurrency-1)) || int(sum.Attempted) != len(ledger.Records()) {
		t.Fatalf("summary %+v, %d records", sum, len(ledger.Records()))
	}
}

func TestVerifierFindsFaults(t *testing.T) {
	s := newFakeServer(t)
	s.dupOnData = func(n int) bool { return n == 3 }
	s.start()
	users := UserNames("example.test", 2)
	_, records := runAgainst(t, s, Config{Spec: testSpec(800, users), Concurrency: 1, Count: 20})

	s.mu.Lock()
	box := s.mu.boxes[users[0]]
	lost := box[len(box)-1]
	s.mu.boxes[users[0]] = box[:len(box)-1]
	box = s.mu.boxes[users[1]]
	box[0] = append([]byte(nil), box[0]...)
	box[0][len(box[0])-3] ^= 1 // flip a bit in the last body line
	s.mu.boxes[users[1]] = append(box, lost, []byte("Subject: not ours\r\n\r\nhi\r\n"))
	s.mu.Unlock()

	rep := verifyAll(t, s, records, users)
	if rep.OK() {
		t.Fatal("faults went unnoticed")
	}
	if len(rep.Missing) != 2 || len(rep.Duplicated) != 1 || len(rep.Corrupt) != 2 || rep.Foreign != 1 {
		t.Fatalf("report %s: missing %v duplicated %v corrupt %v", rep.String(), rep.Missing, rep.Duplicated, rep.Corrupt)
	}
	if !strings.Contains(rep.Corrupt[0]+rep.Corrupt[1], "not addressed to this mailbox") {
		t.Fatalf("misdelivery not reported: %v", rep.Corrupt)
	}
}

// TestSMTPTranscript pins what the client sends: a pipelined group per
// transaction, SIZE, dot-stuffing, RSET after a refused transaction, QUIT.
// Run with -update to rewrite testdata/smtp_session.txt.
func TestSMTPTranscript(t *testing.T) {
	s := newFakeServer(t)
	users := []string{"user0000@example.test", "user0001@example.test"}
	s.rejectTo[users[1]] = 550
	s.mu.transcript = &strings.Builder{}
	s.start()
	runAgainst(t, s, Config{Spec: testSpec(420, users), Concurrency: 1, Count: 4})
	s.stop() // wait for the QUIT exchange to be logged
	got := s.mu.transcript.String()

	golden := filepath.Join("testdata", "smtp_session.txt")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Fatalf("transcript differs from %s (run with -update if intended):\n%s", golden, got)
	}
}

// TestRunCancelUnblocksSilentServer: cancelling the run fails a read that
// is waiting on a server that never answers, long before the reply timeout.
func TestRunCancelUnblocksSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		io.WriteString(c, "220 silent\r\n")
		r.ReadString('\n') // EHLO
		io.WriteString(c, "250 silent\r\n")
		r.ReadString('\n') // MAIL
		close(waiting)
		r.ReadString('\n') // returns when the client closes
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var ledger Ledger
	const timeout = 30 * time.Second
	cfg := Config{Addr: ln.Addr().String(), Spec: testSpec(100, []string{"a@example.test"}),
		Concurrency: 1, Count: 1, Timeout: timeout, OnRecord: ledger.Add}
	type result struct {
		sum Summary
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		sum, err := Run(ctx, cfg)
		done <- result{sum, err}
	}()
	<-waiting
	cancel()
	res := <-done
	if elapsed := time.Since(start); elapsed > timeout/2 {
		t.Fatalf("Run returned %v after cancel; the cancellation was lost", elapsed)
	}
	recs := ledger.Records()
	if res.err != nil || res.sum.NoReply != 1 || res.sum.Errors["cancelled"] != 1 || len(recs) != 1 || recs[0].Stage != StageCommands {
		t.Fatalf("err %v summary %+v records %+v", res.err, res.sum, recs)
	}
}

// TestRunMessagesPerConn: with MessagesPerConn 1 every message has its own
// connection, ended by QUIT (Porcupine, postal); with 0 each worker keeps
// one connection for the run. Both sides count the connections.
func TestRunMessagesPerConn(t *testing.T) {
	for _, tc := range []struct {
		perConn   int
		wantConns int
	}{{1, 60}, {0, 3}, {20, 3}} {
		t.Run(fmt.Sprintf("per-conn-%d", tc.perConn), func(t *testing.T) {
			s := newFakeServer(t)
			s.start()
			users := UserNames("example.test", 5)
			sum, records := runAgainst(t, s, Config{Spec: testSpec(500, users), Concurrency: 3, Count: 60, MessagesPerConn: tc.perConn})
			if sum.Acked != 60 || len(records) != 60 {
				t.Fatalf("summary %+v", sum)
			}
			conns, quits := s.smtpSessions()
			if tc.perConn == 20 {
				// The split of 60 claims among 3 workers is up to the
				// scheduler: between 3 and 5 connections.
				if sum.Connections < 3 || sum.Connections > 5 || int64(conns) != sum.Connections {
					t.Fatalf("client counted %d connections, server %d", sum.Connections, conns)
				}
				return
			}
			if sum.Connections != int64(tc.wantConns) || conns != tc.wantConns {
				t.Fatalf("client counted %d connections, server %d, want %d", sum.Connections, conns, tc.wantConns)
			}
			// Every session ends with QUIT: the server's count is
			// final once Run has returned, since the client read 221.
			if quits != tc.wantConns {
				t.Fatalf("%d sessions ended with QUIT, want %d", quits, tc.wantConns)
			}
			rep := verifyAll(t, s, records, users)
			if !rep.OK() || rep.Present != 60 {
				t.Fatalf("report %s", rep.String())
			}
		})
	}
}

// TestRunOpenLoop: with a rate, message i is not sent before start + i/Rate,
// so 30 messages at 100/s take at least 290 ms, however fast the server.
func TestRunOpenLoop(t *testing.T) {
	s := newFakeServer(t)
	s.start()
	users := UserNames("example.test", 5)
	sum, records := runAgainst(t, s, Config{Spec: testSpec(500, users), Concurrency: 4, Count: 30, Rate: 100})
	if sum.Acked != 30 || len(records) != 30 {
		t.Fatalf("summary %+v", sum)
	}
	if sum.Elapsed < 290*time.Millisecond {
		t.Fatalf("30 messages at 100/s took %v", sum.Elapsed)
	}
}
