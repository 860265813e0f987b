package pop3

import (
	"bytes"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"quill/internal/textconn"
)

var update = flag.Bool("update", false, "rewrite the S: lines of testdata/*.txt from the server's actual responses")

// TestGolden runs every transcript in testdata/*.txt against a server over
// the fixture backend.
//
// Transcript lines:
//
//	# comment
//	!option name[=value]   before anything else: tls, implicit, insecure,
//	                       remote=IP, maxerrors=N, maxunauth=N, maxline=N,
//	                       readtimeout=D, perip=N
//	!connect [n]           open session n (default 1) and read its greeting
//	C[n]: line             send line on session n; its response follows
//	S[n]: line             expected server line (rewritten by -update)
//	!tls [n]               TLS handshake after +OK to STLS
//	!read [n]              read one more server line (e.g. after shutdown)
//	!drop [n]              close session n from the client side
//	!unlocked user         wait until user's maildrop is unlocked
//	!shutdown              start a graceful Shutdown of the server
//	!pipeline A|B|...      send commands in one write on session 1
//	!retr-truncated n      RETR n on session 1 must end in a server close
//	                       without the "." terminator
//
// In C: lines, {x*N} stands for N "x" octets. A server close reads as
// "<EOF>".
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
			backend := fixture()
			got := runTranscript(t, backend, string(script))
			if *update {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			} else if got != string(script) {
				t.Errorf("transcript differs (run with -update to accept):\n%s", lineDiff(string(script), got))
			}
			if check := goldenChecks[name]; check != nil {
				check(t, backend)
			}
		})
	}
}

// goldenChecks verify the backend after a transcript.
var goldenChecks = map[string]func(t *testing.T, b *memBackend){
	"dele_quit": func(t *testing.T, b *memBackend) {
		wantState(t, b, "alice", []string{"uid-2"}, 2, 0)
	},
	"rset": func(t *testing.T, b *memBackend) {
		wantState(t, b, "alice", []string{"uid-1", "uid-2", "uid-3"}, 1, 0)
	},
	"drop_without_quit": func(t *testing.T, b *memBackend) {
		wantState(t, b, "alice", []string{"uid-1", "uid-2", "uid-3"}, 1, 1)
	},
	"shutdown": func(t *testing.T, b *memBackend) {
		wantState(t, b, "alice", []string{"uid-1", "uid-2", "uid-3"}, 0, 1)
	},
	"in_use": func(t *testing.T, b *memBackend) {
		wantState(t, b, "alice", []string{"uid-1", "uid-2", "uid-3"}, 2, 0)
	},
	"commit_failure": func(t *testing.T, b *memBackend) {
		wantState(t, b, "erin", []string{"e-1"}, 1, 0)
	},
	"retr_failure": func(t *testing.T, b *memBackend) {
		b.waitUnlocked(t, "dave")
		wantState(t, b, "dave", []string{"d-1", "d-2"}, 0, 1)
	},
}

func wantState(t *testing.T, b *memBackend, user string, uids []string, commits, closes int) {
	t.Helper()
	gotUIDs, gotCommits, gotCloses := b.state(user)
	if !slices.Equal(gotUIDs, uids) || gotCommits != commits || gotCloses != closes {
		t.Errorf("%s: uids %v, %d commits, %d closes; want %v, %d, %d",
			user, gotUIDs, gotCommits, gotCloses, uids, commits, closes)
	}
}

var (
	lineRE   = regexp.MustCompile(`^([CS])([0-9]?): ?(.*)$`)
	repeatRE = regexp.MustCompile(`\{(.)\*([0-9]+)\}`)
)

// runTranscript plays script and returns it with every S: line replaced by
// what the server actually sent.
func runTranscript(t *testing.T, backend *memBackend, script string) string {
	serverTLS, clientTLS := tlsConfigs(t)
	srv := &Server{Hostname: "pop.test", Backend: backend, Logger: testLogger(t)}
	var remote netip.Addr
	var out strings.Builder
	clients := map[string]*client{}
	var addr string
	var shutdownDone chan error
	started := false
	session := func(n string) *client {
		c := clients[n]
		if c == nil {
			t.Fatalf("session %q used before !connect", n)
		}
		return c
	}
	emit := func(n string, lines ...string) {
		for _, l := range lines {
			fmt.Fprintf(&out, "S%s: %s\n", n, l)
		}
	}
	start := func() {
		if !started {
			started = true
			addr = startServer(t, srv, remote)
		}
	}
	for _, line := range strings.SplitAfter(script, "\n") {
		text := strings.TrimSuffix(line, "\n")
		if text == "" && line == "" {
			continue
		}
		if m := lineRE.FindStringSubmatch(text); m != nil {
			if m[1] == "S" {
				continue // regenerated
			}
			out.WriteString(line)
			start()
			c := session(m[2])
			cmd := repeatRE.ReplaceAllStringFunc(m[3], func(s string) string {
				r := repeatRE.FindStringSubmatch(s)
				n, _ := strconv.Atoi(r[2])
				return strings.Repeat(r[1], n)
			})
			c.send(cmd)
			emit(m[2], c.response(cmd)...)
			continue
		}
		out.WriteString(line)
		if !strings.HasPrefix(text, "!") {
			continue
		}
		verb, arg, _ := strings.Cut(strings.TrimPrefix(text, "!"), " ")
		switch verb {
		case "option":
			if started {
				t.Fatalf("!option after the server started: %q", text)
			}
			applyOption(t, srv, &remote, serverTLS, arg)
		case "connect":
			start()
			var cfg = clientTLS
			if !srv.ImplicitTLS {
				cfg = nil
			}
			c := dial(t, addr, cfg)
			clients[arg] = c
			emit(arg, c.readLine())
		case "tls":
			session(arg).startTLS(clientTLS)
		case "read":
			emit(arg, session(arg).readLine())
		case "drop":
			session(arg).conn.Close()
		case "unlocked":
			backend.waitUnlocked(t, arg)
		case "pipeline":
			c := session("")
			cmds := strings.Split(arg, "|")
			c.send(strings.Join(cmds, "\r\n"))
			for _, cmd := range cmds {
				emit("", c.response(cmd)...)
			}
		case "retr-truncated":
			c := session("")
			c.send("RETR " + arg)
			status := c.readLine()
			rest, err := io.ReadAll(c.r)
			if err != nil && !isReset(err) {
				t.Fatalf("reading truncated RETR: %v", err)
			}
			if len(rest) == 0 || bytes.HasSuffix(rest, []byte("\r\n.\r\n")) {
				t.Fatalf("RETR %s: %d octets after the status line, want a truncated message", arg, len(rest))
			}
			emit("", status, "<EOF>")
		case "shutdown":
			shutdownDone = make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				shutdownDone <- srv.Shutdown(ctx)
			}()
		default:
			t.Fatalf("unknown directive %q", text)
		}
	}
	if shutdownDone != nil {
		if err := <-shutdownDone; err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}
	return out.String()
}

func applyOption(t *testing.T, srv *Server, remote *netip.Addr, serverTLS *tls.Config, opt string) {
	name, value, _ := strings.Cut(opt, "=")
	num := func() int {
		n, err := strconv.Atoi(value)
		if err != nil {
			t.Fatalf("option %q: %v", opt, err)
		}
		return n
	}
	switch name {
	case "tls":
		srv.TLSConfig = serverTLS
	case "implicit":
		srv.TLSConfig = serverTLS
		srv.ImplicitTLS = true
	case "insecure":
		srv.AllowInsecureAuth = true
	case "remote":
		*remote = netip.MustParseAddr(value)
	case "maxerrors":
		srv.MaxErrors = num()
	case "maxunauth":
		srv.MaxUnauthCommands = num()
	case "maxline":
		srv.MaxLineLength = num()
	case "readtimeout":
		d, err := time.ParseDuration(value)
		if err != nil {
			t.Fatal(err)
		}
		srv.ReadTimeout = d
	case "unauthtimeout":
		d, err := time.ParseDuration(value)
		if err != nil {
			t.Fatal(err)
		}
		srv.UnauthTimeout = d
	case "perip":
		srv.Limiter = textconn.NewLimiter(num(), 0)
	default:
		t.Fatalf("unknown option %q", opt)
	}
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
