package e2e

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// swaks exit statuses (swaks(1) "EXIT CODES").
const (
	swaksOK         = 0
	swaksMailFailed = 23 // the server rejected MAIL FROM
	swaksNoRcpt     = 24 // no RCPT TO was accepted
)

// swaksReject matches a reply swaks flags as an error, plain ("<** ") or
// inside TLS ("<~* "), capturing the code and the enhanced status code.
var swaksReject = regexp.MustCompile(`(?m)^<[~*]\* +([2-5]\d\d)[ -]([245]\.\d{1,3}\.\d{1,3})?`)

// runSwaks runs swaks with args and returns its transcript and exit status.
func runSwaks(t *testing.T, args ...string) (string, int) {
	t.Helper()
	bin := requireTool(t, "swaks")
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--timeout", "30", "--helo", "client.e2e.test"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case ctx.Err() != nil:
		t.Fatalf("swaks timed out:\n%s", out.String())
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	default:
		t.Fatalf("swaks: %v", err)
	}
	return "", -1
}

// hostPort splits a listener address into swaks' --server and --port.
func hostPort(t *testing.T, addr string) []string {
	t.Helper()
	return []string{"--server", "127.0.0.1", "--port", port(t, addr)}
}

// TestSwaks drives the MX and submission listeners with swaks: deliveries
// that must succeed, and the refusals a mail operator relies on (open
// relay, unknown user, unauthenticated or forged submission).
func TestSwaks(t *testing.T) {
	s := startServer(t, Options{})
	const alice, alicePW = "alice@example.test", "swaks-alice-pw"
	const bob, bobPW = "bob@example.test", "swaks-bob-pw"
	addUser(t, s, alice, alicePW)
	addUser(t, s, bob, bobPW)
	mx, sub := s.Addr("smtp"), s.Addr("submission")

	delivered := map[string]string{} // token -> case name; what bob must hold
	refused := map[string]string{}   // token -> case name; what nobody may hold

	t.Run("plain delivery", func(t *testing.T) {
		tok := token()
		out, rc := runSwaks(t, append(hostPort(t, mx), "--from", "sender@remote.example", "--to", bob,
			"--header", "Subject: swaks plain "+tok, "--body", "token "+tok)...)
		if rc != swaksOK {
			t.Fatalf("exit %d, want 0:\n%s", rc, out)
		}
		delivered[tok] = "plain delivery"
	})

	t.Run("submission STARTTLS AUTH PLAIN", func(t *testing.T) {
		tok := token()
		out, rc := runSwaks(t, append(hostPort(t, sub), "--tls", "--auth", "PLAIN",
			"--auth-user", alice, "--auth-password", alicePW, "--from", alice, "--to", bob,
			"--header", "Subject: swaks submission "+tok, "--body", "token "+tok)...)
		if rc != swaksOK {
			t.Fatalf("exit %d, want 0:\n%s", rc, out)
		}
		if !strings.Contains(out, "=== TLS started") {
			t.Errorf("no TLS in the transcript:\n%s", out)
		}
		delivered[tok] = "submission"
	})

	// expectRefusal runs swaks and checks the exit status and that a
	// rejection with code class 5 and the given enhanced status code
	// prefix (RFC 3463) appears ("" accepts any).
	expectRefusal := func(t *testing.T, wantRC int, wantCode, wantEnh string, args ...string) {
		t.Helper()
		tok := token()
		refused[tok] = t.Name()
		out, rc := runSwaks(t, append(args, "--header", "Subject: refused "+tok, "--body", "token "+tok)...)
		if rc != wantRC {
			t.Errorf("exit %d, want %d:\n%s", rc, wantRC, out)
		}
		m := swaksReject.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no rejection in the transcript:\n%s", out)
		}
		if (wantCode != "" && m[1] != wantCode) || !strings.HasPrefix(m[1], "5") || !strings.HasPrefix(m[2], wantEnh) {
			t.Errorf("rejected with %q %q, want %s %s:\n%s", m[1], m[2], orAny(wantCode, "5xx"), orAny(wantEnh, "any"), out)
		}
	}

	t.Run("relay denied", func(t *testing.T) {
		expectRefusal(t, swaksNoRcpt, "", "5.7.1", append(hostPort(t, mx),
			"--from", "sender@remote.example", "--to", "victim@elsewhere.example", "--quit-after", "RCPT")...)
	})

	t.Run("unknown local user", func(t *testing.T) {
		expectRefusal(t, swaksNoRcpt, "550", "5.1.1", append(hostPort(t, mx),
			"--from", "sender@remote.example", "--to", "nosuchuser@example.test")...)
	})

	t.Run("submission without AUTH", func(t *testing.T) {
		// RFC 4954 section 6: 530 5.7.0 Authentication required.
		expectRefusal(t, swaksMailFailed, "530", "5.7.0", append(hostPort(t, sub), "--tls",
			"--from", alice, "--to", bob)...)
	})

	t.Run("submission with forged sender", func(t *testing.T) {
		// Authenticated as alice, claiming to be bob: refused at MAIL
		// or at RCPT, never delivered.
		tok := token()
		refused[tok] = t.Name()
		out, rc := runSwaks(t, append(hostPort(t, sub), "--tls", "--auth", "PLAIN",
			"--auth-user", alice, "--auth-password", alicePW, "--from", bob, "--to", bob,
			"--header", "Subject: forged "+tok, "--body", "token "+tok)...)
		if rc != swaksMailFailed && rc != swaksNoRcpt {
			t.Errorf("exit %d, want %d or %d:\n%s", rc, swaksMailFailed, swaksNoRcpt, out)
		}
		if m := swaksReject.FindStringSubmatch(out); m == nil || !strings.HasPrefix(m[1], "5") {
			t.Errorf("no 5xx rejection in the transcript:\n%s", out)
		}
	})

	t.Run("maildrops", func(t *testing.T) {
		msgs := mustFetchAll(t, s.Addr("pop3"), bob, bobPW)
		for tok, name := range delivered {
			if n := len(findToken(msgs, tok)); n != 1 {
				t.Errorf("%s: bob holds %d copies, want 1", name, n)
			}
		}
		all := append(msgs, mustFetchAll(t, s.Addr("pop3"), alice, alicePW)...)
		for tok, name := range refused {
			if n := len(findToken(all, tok)); n != 0 {
				t.Errorf("%s: refused message was delivered anyway", name)
			}
		}
		if len(msgs) != len(delivered) {
			t.Errorf("bob holds %d messages, want %d", len(msgs), len(delivered))
		}
	})
}

func orAny(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}
