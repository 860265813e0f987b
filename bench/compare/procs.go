package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Bounds on the processes the harness runs.
const (
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
	cmdTimeout   = 5 * time.Minute // apt-get, go build, postfix start/stop
)

// child is a server process the harness started and must stop.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  string // its stderr file
}

// startChild runs bin with args, stderr to dir/name.log; with listenerLine
// it waits for the JSON listener line on stdout and returns it.
func startChild(ctx context.Context, dir, name string, listenerLine bool, bin string, args ...string) (*child, map[string]string, error) {
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = logf
	// A child must not outlive the harness, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var pr *os.File
	if listenerLine {
		var pw *os.File
		if pr, pw, err = os.Pipe(); err != nil {
			return nil, nil, err
		}
		cmd.Stdout = pw
		defer pw.Close()
	} else {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		if pr != nil {
			pr.Close()
		}
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	if !listenerLine {
		return c, nil, nil
	}
	linec := make(chan string, 1)
	go func() {
		defer pr.Close()
		br := bufio.NewReaderSize(pr, 4096)
		line, _ := br.ReadString('\n')
		linec <- line
		_, _ = io.Copy(io.Discard, br)
	}()
	select {
	case line := <-linec:
		var addrs map[string]string
		if err := json.Unmarshal([]byte(line), &addrs); err != nil {
			c.stop()
			return nil, nil, fmt.Errorf("%s: listener line %q: %v (see %s)", name, line, err, logPath)
		}
		return c, addrs, nil
	case <-c.done:
		return nil, nil, fmt.Errorf("%s exited at start: %v (see %s)", name, c.err, logPath)
	case <-time.After(startTimeout):
		c.stop()
		return nil, nil, fmt.Errorf("%s: no listener line within %v", name, startTimeout)
	case <-ctx.Done():
		c.stop()
		return nil, nil, ctx.Err()
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop sends SIGTERM, then SIGKILL after stopTimeout, and waits.
func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(stopTimeout):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// running reports an error when the child has exited.
func (c *child) running() error {
	select {
	case <-c.done:
		return fmt.Errorf("%s exited: %v (see %s)", c.name, c.err, c.log)
	default:
		return nil
	}
}

// runCmd runs one command to completion within cmdTimeout and returns its
// combined output.
func runCmd(ctx context.Context, env []string, bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", bin, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// freePort returns a loopback port that was free a moment ago, for the
// daemons that cannot report a port they chose themselves (Postfix,
// Dovecot). Quill and the sink bind port 0 instead.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitListening polls addr until it accepts a connection: the daemon is
// ready. The 50 ms tick only paces the polling.
func waitListening(ctx context.Context, addr string, alive func() error) error {
	deadline := time.Now().Add(startTimeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if alive != nil {
			if aerr := alive(); aerr != nil {
				return aerr
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening within %v: %v", addr, startTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// readPID reads a daemon's pid file.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
