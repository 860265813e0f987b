package server

import (
	"bufio"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/config"
)

// greeting dials addr and returns the server's first line.
func greeting(t *testing.T, addr string) (string, net.Conn) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		t.Fatalf("greeting from %s: %v", addr, err)
	}
	return strings.TrimRight(line, "\r\n"), c
}

// TestOverloadedNodeRefusesNewConnections: with the Go scheduler of the
// node's process saturated (more busy goroutines than CPUs), a real
// server turns overloaded and answers every new connection at once with
// its protocol's refusal (SMTP 421 4.3.2, IMAP BYE [UNAVAILABLE], POP3
// -ERR [SYS/TEMP]) and closes it, while a session opened before goes on
// being served; once the load is gone it greets normally again.
func TestOverloadedNodeRefusesNewConnections(t *testing.T) {
	cfg := testConfig(t)
	cfg.Listeners.IMAP = "127.0.0.1:0"
	cfg.Limits.OverloadLatency = config.Duration{Duration: 2 * time.Millisecond}
	s := startServer(t, cfg)
	smtpAddr := s.listeners["smtp"].Addr().String()
	imapAddr := s.listeners["imap"].Addr().String()
	pop3Addr := s.listeners["pop3"].Addr().String()

	if g, c := greeting(t, smtpAddr); !strings.HasPrefix(g, "220 ") {
		t.Fatalf("SMTP greeting before any load: %q", g)
	} else {
		c.Close()
	}
	_, open := greeting(t, smtpAddr) // kept open through the overload
	defer open.Close()
	openR := bufio.NewReader(open)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for range 8 * runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				for i := 0; i < 1e6; i++ {
					_ = math.Sqrt(float64(i))
				}
				runtime.Gosched()
			}
		}()
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		g, c := greeting(t, smtpAddr)
		if strings.HasPrefix(g, "421 4.3.2 ") && strings.Contains(g, "overloaded") {
			if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
				t.Fatalf("after %q: %q, %v (want the connection closed after the 421)", g, rest, err)
			}
			c.Close()
			break
		}
		c.Close()
		if !strings.HasPrefix(g, "220 ") {
			t.Fatalf("SMTP greeting while loading: %q", g)
		}
		if time.Now().After(deadline) {
			t.Fatal("the node never turned overloaded under spinning goroutines")
		}
		// A new connection after each one: the refusal appears within
		// two samples once the scheduler is saturated.
	}
	if g, c := greeting(t, imapAddr); g != "* BYE [UNAVAILABLE] server overloaded, try again later" {
		t.Errorf("IMAP greeting while overloaded: %q", g)
	} else {
		c.Close()
	}
	if g, c := greeting(t, pop3Addr); g != "-ERR [SYS/TEMP] server overloaded, try again later" {
		t.Errorf("POP3 greeting while overloaded: %q", g)
	} else {
		c.Close()
	}
	// The session opened before is still served.
	if _, err := io.WriteString(open, "NOOP\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := openR.ReadString('\n'); err != nil || !strings.HasPrefix(line, "250") {
		t.Errorf("NOOP on a session opened before the overload: %q, %v", line, err)
	}
	if code := readyz(t, s); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while overloaded: %d, want 503", code)
	}
	metrics := scrape(t, s)
	if !strings.Contains(metrics, "\nquill_overloaded 1\n") || !strings.Contains(metrics, "quill_overload_episodes_total 1") {
		t.Errorf("metrics while overloaded lack quill_overloaded 1 / one episode:\n%s", grep(metrics, "overload"))
	}

	cancel()
	wg.Wait()
	deadline = time.Now().Add(30 * time.Second)
	for {
		g, c := greeting(t, smtpAddr)
		c.Close()
		if strings.HasPrefix(g, "220 ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still refusing after the load ended: %q", g)
		}
	}
	if code := readyz(t, s); code != http.StatusOK {
		t.Errorf("/readyz after the overload: %d, want 200", code)
	}
}

func readyz(t *testing.T, s *Server) int {
	t.Helper()
	resp, err := http.Get("http://" + s.listeners["admin"].Addr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// scrape returns the admin endpoint's /metrics.
func scrape(t *testing.T, s *Server) string {
	t.Helper()
	resp, err := http.Get("http://" + s.listeners["admin"].Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grep(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
