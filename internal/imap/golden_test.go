package imap

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/store/embedded"
)

var update = flag.Bool("update", false, "rewrite the S: lines of testdata/*.txt from the server's actual responses")

// TestGolden runs every transcript in testdata/*.txt against a server over
// the real mailbox service and embedded engine (newTestBackend).
//
// Transcript lines:
//
//	# comment
//	!option name[=value]  before anything else: tls, implicit, insecure,
//	                      remote=IP, maxerrors=N, maxliteral=N,
//	                      appendlimit=N, maxline=N, rate=N (commands
//	                      per second), burst=N, timeout=DURATION (autologout
//	                      after login), unauthtimeout=DURATION,
//	                      idlepoll=DURATION, expungewindow=N (MODSEQs
//	                      of expunges the store keeps)
//	!connect [n]          open session n and read its greeting
//	C[n]: line            send line (<CRLF> stands for CRLF inside it);
//	                      the response through its tagged line (or a
//	                      continuation request) follows
//	S[n]: line            expected server line (rewritten by -update)
//	!tls [n]              TLS handshake after OK to STARTTLS
//	!compress [n]         raw deflate both ways after OK to COMPRESS
//	!read [n]             read one more server line (IDLE pushes)
//	!deliver user subject deliver a message to user's INBOX, as SMTP does
//	!deliver-elsewhere user subject
//	                      the same, as another node sharing the store would:
//	                      the hub is not told (only IdlePoll finds it)
//	!churn user n         deliver n messages to user and expunge each at
//	                      once, as POP3 through another node does
//	!quota user octets    set user's quota (0: unlimited), as the operator does
//	!shutdown             Shutdown the server (sessions get BYE)
//	!clock DURATION       advance the command rate limit's clock, which
//	                      otherwise stands still
//
// UIDVALIDITY values derive from the clock, so numbers within a day of now
// read as "UV" in the output; in C: lines, the word UV stands for the last
// UIDVALIDITY the server sent.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no transcripts in testdata")
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".txt")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			script, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got := runTranscript(t, string(script))
			if *update {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			} else if got != string(script) {
				t.Errorf("transcript differs (run with -update to accept):\n%s", lineDiff(string(script), got))
			}
		})
	}
}

var (
	lineRE = regexp.MustCompile(`^([CS])([0-9]?): ?(.*)$`)
	numRE  = regexp.MustCompile(`\b1[0-9]{9}\b`)
	uvRE   = regexp.MustCompile(`UIDVALIDITY ([0-9]+)`)
	uvWord = regexp.MustCompile(`\bUV\b`)
)

// maskUV replaces clock-derived UIDVALIDITY values with "UV".
func maskUV(s string) string {
	now := time.Now().Unix()
	return numRE.ReplaceAllStringFunc(s, func(n string) string {
		v, _ := strconv.ParseInt(n, 10, 64)
		if v > now-86400 && v < now+86400 {
			return "UV"
		}
		return n
	})
}

func runTranscript(t *testing.T, script string) string {
	serverTLS, clientTLS := tlsConfigs(t)
	var clock atomic.Int64 // nanoseconds after fixtureDate
	srv := &Server{Hostname: "imap.test", Logger: testLogger(t),
		Now: func() time.Time { return fixtureDate.Add(time.Duration(clock.Load())) }}
	// The backend opens at first use, after the store's options.
	var storeOpts embedded.Options
	var backend *testBackend
	be := func() *testBackend {
		if backend == nil {
			backend = newTestBackendWith(t, storeOpts)
			srv.Backend = backend
		}
		return backend
	}
	var remote netip.Addr
	var out strings.Builder
	clients := map[string]*client{}
	var addr string
	started := false
	session := func(n string) *client {
		c := clients[n]
		if c == nil {
			t.Fatalf("session %q used before !connect", n)
		}
		return c
	}
	lastUV := ""
	emit := func(n string, lines ...string) {
		for _, l := range lines {
			if m := uvRE.FindStringSubmatch(l); m != nil {
				lastUV = m[1]
			}
			fmt.Fprintf(&out, "S%s: %s\n", n, maskUV(l))
		}
	}
	start := func() {
		if !started {
			started = true
			be()
			addr = startServer(t, srv, remote)
		}
	}
	for _, line := range strings.SplitAfter(script, "\n") {
		text := strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		if m := lineRE.FindStringSubmatch(text); m != nil {
			if m[1] == "S" {
				continue
			}
			out.WriteString(line)
			start()
			emit(m[2], session(m[2]).command(uvWord.ReplaceAllString(m[3], lastUV))...)
			continue
		}
		out.WriteString(line)
		if !strings.HasPrefix(text, "!") {
			continue
		}
		verb, arg, _ := strings.Cut(strings.TrimPrefix(text, "!"), " ")
		switch verb {
		case "option":
			if started || backend != nil {
				t.Fatalf("!option after the server started: %q", text)
			}
			name, value, _ := strings.Cut(arg, "=")
			dur := func() time.Duration {
				d, err := time.ParseDuration(value)
				if err != nil {
					t.Fatalf("option %q: %v", arg, err)
				}
				return d
			}
			num := func() int {
				n, err := strconv.Atoi(value)
				if err != nil {
					t.Fatalf("option %q: %v", arg, err)
				}
				return n
			}
			switch name {
			case "tls":
				srv.TLSConfig = serverTLS
			case "implicit":
				srv.TLSConfig, srv.ImplicitTLS = serverTLS, true
			case "insecure":
				srv.AllowInsecureAuth = true
			case "remote":
				remote = netip.MustParseAddr(value)
			case "maxerrors":
				srv.MaxErrors = num()
			case "maxliteral":
				srv.MaxLiteral = int64(num())
			case "appendlimit":
				srv.AppendLimit = int64(num())
			case "maxline":
				srv.MaxLineLength = num()
			case "rate":
				srv.CommandRate = float64(num())
			case "burst":
				srv.CommandBurst = num()
			case "timeout":
				srv.ReadTimeout = dur()
			case "unauthtimeout":
				srv.UnauthTimeout = dur()
			case "idlepoll":
				srv.IdlePoll = dur()
			case "expungewindow":
				storeOpts.ExpungeWindow = uint64(num())
			default:
				t.Fatalf("unknown option %q", arg)
			}
		case "connect":
			start()
			cfg := clientTLS
			if !srv.ImplicitTLS {
				cfg = nil
			}
			c := dial(t, addr, cfg)
			clients[arg] = c
			emit(arg, c.readLines()...)
		case "tls":
			session(arg).startTLS(clientTLS)
		case "compress":
			session(arg).compress()
		case "read":
			emit(arg, session(arg).readLines()...)
		case "deliver":
			user, subject, _ := strings.Cut(arg, " ")
			be().deliver(t, user, "From: x@example.org\r\nSubject: "+subject+"\r\n\r\nbody\r\n")
		case "deliver-elsewhere":
			user, subject, _ := strings.Cut(arg, " ")
			be().deliverElsewhere(t, user, "From: x@example.org\r\nSubject: "+subject+"\r\n\r\nbody\r\n")
		case "churn":
			user, count, _ := strings.Cut(arg, " ")
			n, err := strconv.Atoi(count)
			if err != nil {
				t.Fatalf("!churn %q: %v", arg, err)
			}
			be().churn(t, user, n)
		case "quota":
			user, octets, _ := strings.Cut(arg, " ")
			n, err := strconv.ParseInt(octets, 10, 64)
			if err != nil {
				t.Fatalf("!quota %q: %v", arg, err)
			}
			be().setQuota(t, user, n)
		case "clock":
			d, err := time.ParseDuration(arg)
			if err != nil {
				t.Fatalf("!clock %q: %v", arg, err)
			}
			clock.Add(int64(d))
		case "shutdown":
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := srv.Shutdown(ctx)
			cancel()
			if err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		default:
			t.Fatalf("unknown directive %q", text)
		}
	}
	return out.String()
}

// lineDiff shows the first differing line of two transcripts.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\nwant %q\ngot  %q\n--- full output ---\n%s", i+1, wl, gl, got)
		}
	}
	return ""
}
