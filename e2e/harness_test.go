// Package e2e holds Quill's black-box end-to-end tests: they build the real
// quill binary once, run it as a child process on a temporary data
// directory with every listener on 127.0.0.1:0, and talk to it with real
// mail clients (Python smtplib/poplib, swaks, fetchmail, Postfix over LMTP)
// and with the small bounded Go clients in client_test.go.
//
// The harness in this file is shared by every test in the package:
//
//	s := startServer(t, Options{})           // stopped (SIGTERM) by t.Cleanup
//	addUser(t, s, "alice@example.test", "pw")
//	addAlias(t, s, "postmaster@example.test", "alice@example.test")
//	s.Addr("smtp")                           // "127.0.0.1:41001"
//	s.Kill()                                 // SIGKILL, as a crash
//	s.Restart(t)                             // same --data, new ports
//
// External tools are required, never optional: a test whose tool is missing
// fails (scripts/install-test-deps installs them). Nothing here sleeps to
// synchronise: readiness is the --print-listeners line read from a pipe,
// exit is cmd.Wait, and the only polling is a bounded loop on an observable
// condition (see eventually).
//
// Environment:
//
//	QUILL_E2E_BIN   use this prebuilt binary instead of building ./cmd/quill
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bounds on how long the harness waits for the child process. They are
// generous for a -race build on two loaded cores; reaching one is a failure.
// The first start on a fresh Cassandra keyspace, or `quill cluster init`,
// creates the schema: on the 3-node cluster each statement waits for the
// nodes to agree, 37 s in all on a lightly loaded machine, and more than a
// minute was seen under CI's load.
const (
	startTimeout = 3 * time.Minute  // until the --print-listeners line
	stopTimeout  = 30 * time.Second // SIGTERM drain until exit
	cliTimeout   = 3 * time.Minute  // one `quill user|alias|check|cluster` run
	killTimeout  = 10 * time.Second // SIGKILL until Wait returns
)

// DefaultDomain is the local domain every server gets unless Options says otherwise.
const DefaultDomain = "example.test"

// Listeners are the names the binary uses in its --print-listeners JSON and
// whose flags are --NAME-addr.
var Listeners = []string{"smtp", "submission", "submissions", "lmtp", "pop3", "pop3s", "imap", "imaps", "admin"}

// quillBin is the binary under test, set once by TestMain.
var quillBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if bin := os.Getenv("QUILL_E2E_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: QUILL_E2E_BIN: %v\n", err)
			return 2
		}
		quillBin = abs
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "quill-e2e-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 2
	}
	defer os.RemoveAll(dir)
	quillBin = filepath.Join(dir, "quill")
	// The server is built with the race detector whenever the tests are
	// (go test -race), so a data race in the server fails its exit status.
	args := []string{"build", "-o", quillBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "quill/cmd/quill")
	build := exec.Command("go", args...)
	build.Stdout = os.Stderr
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go %s: %v\n", strings.Join(args, " "), err)
		return 2
	}
	return m.Run()
}

// Options configure startServer. The zero value is one domain
// (DefaultDomain), every listener on 127.0.0.1:0, a fresh data directory.
type Options struct {
	// Domains are the local domains (--domain, repeated). Default: DefaultDomain.
	Domains []string
	// DataDir reuses an existing data directory; "" means a new t.TempDir().
	DataDir string
	// Listen overrides the address of a listener by name ("smtp", ...),
	// e.g. "off". Unnamed listeners get 127.0.0.1:0.
	Listen map[string]string
	// ConfigFile is passed as --config when not "".
	ConfigFile string
	// Env is appended to the child's environment.
	Env []string
	// ExtraArgs are appended to the serve command line.
	ExtraArgs []string
	// Gid, when not 0, runs the process with this group ID (the user ID
	// stays), so that firewall rules can match its packets by owner
	// (iptables -m owner --gid-owner; the robustness harness's
	// partitions). It needs root.
	Gid uint32
}

// Server is one quill serve process and the data directory it owns. Its
// methods take the testing.TB they report to; a Server is used by one test
// (and its goroutines) at a time.
type Server struct {
	t       testing.TB // the test that started it
	opts    Options
	DataDir string
	Domain  string // the first local domain

	log *tailBuffer // stderr (and stray stdout) of every generation

	mu    sync.Mutex
	gen   int               // how many processes have been started
	proc  *exec.Cmd         // the current process; nil before the first start
	done  chan struct{}     // closed when proc has been waited for
	err   error             // proc's Wait result, valid after done is closed
	addrs map[string]string // the current --print-listeners map
	sig   bool              // a signal was sent to the current proc by the harness
	stopd bool              // the current proc was sent SIGSTOP and not SIGCONT
}

// startServer starts quill serve and returns once every listener is bound
// and serving. t.Cleanup stops it with SIGTERM and fails the test when it
// does not exit 0 within stopTimeout (it is then killed). On failure the
// server's stderr is printed.
func startServer(t testing.TB, opts Options) *Server {
	t.Helper()
	if len(opts.Domains) == 0 {
		opts.Domains = []string{DefaultDomain}
	}
	s := &Server{t: t, opts: opts, DataDir: opts.DataDir, Domain: opts.Domains[0], log: newTailBuffer(4 << 20)}
	if s.DataDir == "" {
		s.DataDir = t.TempDir()
	}
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("quill server log (data %s):\n%s", s.DataDir, s.log.String())
		}
	})
	if err := s.start(); err != nil {
		t.Fatalf("start quill: %v", err)
	}
	return s
}

// Addr returns the bound address ("127.0.0.1:41001") of the named listener
// of the current process; it fails the test (from the test goroutine) when
// the server did not report one.
func (s *Server) Addr(name string) string {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.addrs[name]
	if !ok {
		s.t.Fatalf("quill reported no %q listener (have %v)", name, keys(s.addrs))
	}
	return a
}

// Addrs returns a copy of the current listener map.
func (s *Server) Addrs() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]string, len(s.addrs))
	for k, v := range s.addrs {
		m[k] = v
	}
	return m
}

// Log returns everything the server wrote to stderr so far (the tail, when
// it exceeds the buffer).
func (s *Server) Log() string { return s.log.String() }

// Kill sends SIGKILL, as a crash would, and waits for the process to exit.
// The data directory is left as the crash left it. Restart starts it again.
func (s *Server) Kill() {
	t := s.t
	t.Helper()
	s.mu.Lock()
	proc, done := s.proc, s.done
	s.sig = true
	s.mu.Unlock()
	if proc == nil {
		t.Fatal("Kill: server never started")
	}
	select {
	case <-done:
		t.Fatalf("Kill: server had already exited: %v", s.waitErr())
	default:
	}
	_ = proc.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(killTimeout):
		t.Fatalf("Kill: process %d did not exit within %v of SIGKILL", proc.Process.Pid, killTimeout)
	}
}

// Pause sends SIGSTOP: the process keeps its sockets and its state but
// runs no code (a long GC pause, a VM migration) until Resume. Stop,
// Restart and the test's cleanup resume it first.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("pause: server never started")
	}
	if err := s.proc.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	s.stopd = true
	return nil
}

// Resume sends SIGCONT to a paused process.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumeLocked()
}

func (s *Server) resumeLocked() error {
	if s.proc == nil || !s.stopd {
		return nil
	}
	s.stopd = false
	if err := s.proc.Process.Signal(syscall.SIGCONT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("resume: %w", err)
	}
	return nil
}

// PinListeners makes every later start (Restart) bind the addresses the
// current process has, so that clients keep the addresses they know. A
// port taken meanwhile by another process makes that start fail.
func (s *Server) PinListeners() {
	s.mu.Lock()
	defer s.mu.Unlock()
	listen := make(map[string]string, len(s.addrs))
	for k, v := range s.opts.Listen {
		listen[k] = v
	}
	for k, v := range s.addrs {
		listen[k] = v
	}
	s.opts.Listen = listen
}

// Stop sends SIGTERM and waits for a graceful exit; it fails the test when
// the exit status is not 0 or the drain exceeds stopTimeout.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.stop(t)
}

// Restart stops the server if it is running (gracefully, as Stop) and
// starts a new process on the same data directory. Listener addresses
// change: call Addr again afterwards.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.stop(t)
	if err := s.start(); err != nil {
		t.Fatalf("restart quill: %v", err)
	}
}

// Running reports whether the current process has not exited.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func (s *Server) waitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// stop ends the current process if it is running. A process that exited
// without the harness signalling it is reported as a failure.
func (s *Server) stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	proc, done, signalled := s.proc, s.done, s.sig
	s.sig = true
	resumeErr := s.resumeLocked() // a stopped process would not see SIGTERM
	s.mu.Unlock()
	if proc == nil {
		return
	}
	if resumeErr != nil {
		t.Errorf("stopping quill: %v", resumeErr)
	}
	select {
	case <-done:
		if !signalled {
			t.Errorf("quill exited on its own before the test stopped it: %v", s.waitErr())
		}
		return
	default:
	}
	_ = proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		if err := s.waitErr(); err != nil {
			t.Errorf("quill did not exit 0 after SIGTERM: %v", err)
		}
	case <-time.After(stopTimeout):
		_ = proc.Process.Signal(syscall.SIGKILL)
		<-done
		t.Errorf("quill did not exit within %v of SIGTERM; killed", stopTimeout)
	}
}

// start runs one `quill serve` process and waits for its listener line.
// When it fails, the process has exited and the failure is the report.
func (s *Server) start() (err error) {
	defer func() {
		if err != nil {
			s.mu.Lock()
			s.sig = true
			s.mu.Unlock()
		}
	}()
	args := []string{"serve", "--data", s.DataDir, "--print-listeners"}
	for _, d := range s.opts.Domains {
		args = append(args, "--domain", d)
	}
	for _, name := range Listeners {
		addr := "127.0.0.1:0"
		if a, ok := s.opts.Listen[name]; ok {
			addr = a
		}
		args = append(args, "--"+name+"-addr", addr)
	}
	if s.opts.ConfigFile != "" {
		args = append(args, "--config", s.opts.ConfigFile)
	}
	args = append(args, s.opts.ExtraArgs...)

	// stdout is our own pipe, not cmd.StdoutPipe, so that Wait (in its own
	// goroutine) never races the reader.
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.gen++
	gen := s.gen
	s.mu.Unlock()
	fmt.Fprintf(s.log, "=== quill serve #%d: %s %s\n", gen, quillBin, strings.Join(args, " "))

	cmd := exec.Command(quillBin, args...)
	cmd.Env = append(os.Environ(), s.opts.Env...)
	cmd.Stdout = pw
	cmd.Stderr = s.log
	// The server must not outlive the test binary (a panic or a -timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if s.opts.Gid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(os.Getuid()), Gid: s.opts.Gid}
	}
	if err := cmd.Start(); err != nil {
		pw.Close()
		pr.Close()
		return err
	}
	pw.Close()
	done := make(chan struct{})
	s.mu.Lock()
	s.proc, s.done, s.err, s.addrs, s.sig, s.stopd = cmd, done, nil, nil, false, false
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(done)
	}()

	// The first stdout line is the listener map; anything after it breaks
	// the "exactly one line" contract and is logged for the failure report.
	type result struct {
		line []byte
		err  error
	}
	linec := make(chan result, 1)
	// The reader owns pr and drains it to EOF (the child's exit): closing
	// it early would SIGPIPE a server that writes to stdout again.
	go func() {
		defer pr.Close()
		br := bufio.NewReaderSize(pr, 64<<10)
		line, err := br.ReadSlice('\n')
		linec <- result{append([]byte(nil), line...), err}
		if err != nil {
			return
		}
		rest, _ := io.ReadAll(io.LimitReader(br, 1<<20))
		if len(rest) > 0 {
			fmt.Fprintf(s.log, "=== quill serve #%d: unexpected stdout after the listener line:\n%s\n", gen, rest)
		}
		_, _ = io.Copy(io.Discard, br)
	}()

	var line []byte
	select {
	case r := <-linec:
		if r.err != nil {
			<-done
			return fmt.Errorf("no listener line on stdout (%v); process exited: %v", r.err, s.waitErr())
		}
		line = r.line
	case <-done:
		return fmt.Errorf("quill serve exited before printing its listeners: %v", s.waitErr())
	case <-time.After(startTimeout):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		return fmt.Errorf("no listener line within %v; killed", startTimeout)
	}
	var addrs map[string]string
	if err := json.Unmarshal(bytes.TrimSpace(line), &addrs); err != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		return fmt.Errorf("listener line %q is not a JSON object of strings: %v", line, err)
	}
	for name, a := range addrs {
		if strings.HasSuffix(a, ":0") {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
			return fmt.Errorf("listener %s reported unbound address %q", name, a)
		}
	}
	s.mu.Lock()
	s.addrs = addrs
	s.mu.Unlock()
	return nil
}

// Quill runs one `quill ARGS...` command to completion with stdin and
// returns its combined stdout and stderr; err is non-nil on a non-zero
// exit. It is for CLI sub-commands, not serve.
func Quill(t testing.TB, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, quillBin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.WaitDelay = killTimeout
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("quill %s: timed out after %v: %w", strings.Join(args, " "), cliTimeout, err)
	}
	return out.String(), err
}

// mustQuill is Quill that fails the test on a non-zero exit.
func mustQuill(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := Quill(t, stdin, args...)
	if err != nil {
		t.Fatalf("quill %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// addUser creates a user through the CLI on the server's data directory
// (the contract says this works while the server runs).
func addUser(t testing.TB, s *Server, address, password string) {
	t.Helper()
	mustQuill(t, password+"\n", "user", "add", address, "--data", s.DataDir)
}

// addAlias makes alias deliver to target through the CLI.
func addAlias(t testing.TB, s *Server, alias, target string) {
	t.Helper()
	mustQuill(t, "", "alias", "add", alias, target, "--data", s.DataDir)
}

// eventually polls cond until it returns nil or timeout passes, and then
// fails the test with cond's last error. It is for conditions that another
// process makes true on its own schedule (a Postfix queue run); the
// interval only paces the polling, it never stands in for a condition.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within %v: %v", what, timeout, err)
		}
		<-tick.C
	}
}

// requireTool fails (never skips) when a required external program is missing.
func requireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is required by this test and is not installed (run scripts/install-test-deps): %v", name, err)
	}
	return p
}

// tailBuffer is an io.Writer safe for concurrent use that keeps at most max
// bytes, dropping the oldest.
type tailBuffer struct {
	mu      sync.Mutex
	buf     []byte
	max     int
	dropped int64
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.dropped += int64(over)
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped > 0 {
		return fmt.Sprintf("[... %d earlier bytes dropped ...]\n%s", b.dropped, b.buf)
	}
	return string(b.buf)
}

func keys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
