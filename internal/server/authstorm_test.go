package server

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/auth"
	"quill/internal/store/embedded"
)

// vmRSS returns this process's resident set size in bytes, from
// /proc/self/status.
func vmRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kib << 10
		}
	}
	t.Skip("no VmRSS in /proc/self/status")
	return 0
}

// imapLogin connects from local (nil: any) to addr, sends LOGIN and
// returns the tagged reply.
func imapLogin(addr string, local net.IP, user, password string) (string, error) {
	d := net.Dialer{Timeout: 30 * time.Second}
	if local != nil {
		d.LocalAddr = &net.TCPAddr{IP: local}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil {
		return "", fmt.Errorf("greeting: %w", err)
	}
	if _, err := fmt.Fprintf(c, "a LOGIN %s %s\r\n", user, password); err != nil {
		return "", err
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("LOGIN reply: %w", err)
		}
		if strings.HasPrefix(line, "a ") {
			return strings.TrimRight(line, "\r\n"), nil
		}
	}
}

// A thousand logins for unknown users arriving at once, each from its own
// address (so that no per-address throttle helps), hold the server's
// memory within a bound: the password checks run in a bounded pool, the
// excess waits briefly and is refused with NO [UNAVAILABLE]. A legitimate
// user logging in meanwhile (retrying on the temporary refusal, as clients
// do) gets in. Before the pool, each attempt held its own 19 MiB of
// argon2id memory: 200 such attempts took the server from 262 MB to
// 3.85 GB.
func TestLoginStormBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("a thousand real argon2id logins")
	}
	const storm = 1000
	// The bound on the growth of this process's RSS (server and clients
	// together): the KDF memory budget configured below plus room for a
	// thousand connections at both ends and for the garbage collector's
	// headroom while checks allocate 19 MiB each; the race detector's
	// state for two thousand goroutines needs more. Without the pool the
	// storm needs 1000 x 19 MiB.
	const budget = 128 << 20
	bound := int64(budget + 384<<20)
	if raceEnabled {
		bound = 2 << 30
	}

	cfg := testConfig(t)
	cfg.Listeners.SMTP, cfg.Listeners.POP3, cfg.Listeners.LMTPSocket = "off", "off", ""
	cfg.Listeners.IMAP = "127.0.0.1:0"
	cfg.Limits.MaxConnections = 2 * storm
	cfg.Auth.KDFMemoryBudget = budget
	st, err := embedded.Open(filepath.Join(cfg.DataDir, StoreDir), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := &auth.Directory{Store: st, KDF: auth.DefaultKDF}
	if err := d.AddUser(context.Background(), "alice@example.test", "password1", 0); err != nil {
		t.Fatal(err)
	}
	st.Close()
	s := startServer(t, cfg)
	addr := s.Listeners()["imap"]

	runtime.GC()
	debug.FreeOSMemory()
	base := vmRSS(t)
	var peak int64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			peak = max(peak, vmRSS(t))
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()

	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	results := map[string]int{}
	for i := range storm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Each attacker has its own loopback address: 127.1.x.y.
			ip := net.IPv4(127, 1, byte(i/250), byte(i%250+1))
			reply, err := imapLogin(addr, ip, fmt.Sprintf("nobody%d", i), "guess")
			if err != nil {
				reply = "error: " + err.Error()
			} else if f := strings.Fields(reply); len(f) > 2 && strings.HasPrefix(f[2], "[") {
				reply = f[1] + " " + f[2]
			}
			mu.Lock()
			results[reply]++
			mu.Unlock()
		}()
	}
	legit := make(chan error, 1)
	var tries int
	var took time.Duration
	go func() {
		<-start
		t0 := time.Now()
		for deadline := t0.Add(2 * time.Minute); time.Now().Before(deadline); {
			tries++
			reply, err := imapLogin(addr, net.IPv4(127, 0, 0, 1), "alice", "password1")
			if err != nil {
				legit <- err
				return
			}
			if strings.HasPrefix(reply, "a OK") {
				took = time.Since(t0)
				legit <- nil
				return
			}
			if !strings.Contains(reply, "[UNAVAILABLE]") {
				legit <- fmt.Errorf("legitimate login refused: %s", reply)
				return
			}
		}
		legit <- fmt.Errorf("legitimate login still refused after 2 minutes")
	}()
	close(start)
	wg.Wait()
	lerr := <-legit
	close(done)
	<-sampled

	t.Logf("%d logins at once: %v; legitimate login after %d tries, %v; RSS %d MiB before, peak %d MiB (+%d MiB, bound %d MiB)",
		storm, results, tries, took.Round(time.Millisecond), base>>20, peak>>20, (peak-base)>>20, bound>>20)
	if lerr != nil {
		t.Error(lerr)
	}
	if results["NO [AUTHENTICATIONFAILED]"]+results["NO [UNAVAILABLE]"] != storm {
		t.Errorf("unexpected replies: %v", results)
	}
	if peak-base > bound {
		t.Errorf("RSS grew by %d MiB during the storm, bound %d MiB", (peak-base)>>20, bound>>20)
	}
}
