package loadgen

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeServer is a minimal SMTP + POP3 server over one in-memory store, real
// enough to test the client: it pipelines, unstuffs, prepends trace fields
// and can be told to misbehave.
type fakeServer struct {
	t         *testing.T
	smtpLn    net.Listener
	pop3Ln    net.Listener
	noPipe    bool              // do not advertise PIPELINING
	rejectTo  map[string]int    // RCPT address -> reply code
	dieOnData func(n int) bool  // drop the connection instead of replying to message n (1-based)
	dupOnData func(n int) bool  // store message n twice
	passwords map[string]string // POP3 logins
	hold      bool              // acknowledge messages but never make them visible (a queue that never drains)

	mu struct {
		sync.Mutex
		boxes      map[string][][]byte
		held       int             // messages acknowledged under hold
		locked     map[string]bool // maildrops held by a POP3 session
		dataCount  int
		smtpConns  int // SMTP connections accepted
		smtpQuits  int // SMTP sessions ended by QUIT
		conns      map[net.Conn]struct{}
		transcript *strings.Builder // when non-nil, the SMTP dialogue
	}
	wg sync.WaitGroup
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	s := &fakeServer{t: t, rejectTo: map[string]int{}, passwords: map[string]string{}}
	s.mu.boxes = map[string][][]byte{}
	s.mu.locked = map[string]bool{}
	s.mu.conns = map[net.Conn]struct{}{}
	return s
}

// start listens on 127.0.0.1:0 for both protocols; the test's cleanup
// stops the server.
func (s *fakeServer) start() {
	var err error
	if s.smtpLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		s.t.Fatal(err)
	}
	if s.pop3Ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		s.t.Fatal(err)
	}
	s.wg.Go(func() { s.serve(s.smtpLn, s.smtpSession) })
	s.wg.Go(func() { s.serve(s.pop3Ln, s.pop3Session) })
	s.t.Cleanup(s.stop)
}

func (s *fakeServer) stop() {
	s.smtpLn.Close()
	s.pop3Ln.Close()
	s.mu.Lock()
	for c := range s.mu.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *fakeServer) serve(ln net.Listener, session func(*bufio.Reader, *bufio.Writer) bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.mu.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				c.Close()
				s.mu.Lock()
				delete(s.mu.conns, c)
				s.mu.Unlock()
			}()
			session(bufio.NewReader(c), bufio.NewWriter(c))
		})
	}
}

func (s *fakeServer) box(name string) [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.boxes[strings.ToLower(name)]
}

func (s *fakeServer) logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.transcript != nil {
		fmt.Fprintf(s.mu.transcript, format, args...)
	}
}

// smtpSession serves one SMTP connection; replies are flushed whenever the
// client has nothing more buffered, as RFC 2920 section 3.2 allows.
func (s *fakeServer) smtpSession(r *bufio.Reader, w *bufio.Writer) bool {
	reply := func(line string) bool {
		s.logf("S: %s\n", line)
		w.WriteString(line + "\r\n")
		if r.Buffered() == 0 {
			return w.Flush() == nil
		}
		return true
	}
	s.mu.Lock()
	s.mu.smtpConns++
	s.mu.Unlock()
	reply("220 fake ESMTP")
	var from string
	var rcpts []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return false
		}
		line = strings.TrimRight(line, "\r\n")
		s.logf("C: %s\n", line)
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			reply("250-fake greets " + arg)
			if !s.noPipe {
				reply("250-PIPELINING")
			}
			reply("250 SIZE 100000000")
		case "MAIL":
			if from != "" {
				reply("503 5.5.1 nested MAIL")
				continue
			}
			from = strings.TrimPrefix(arg, "FROM:")
			from, _, _ = strings.Cut(from, " ")
			reply("250 2.1.0 ok")
		case "RCPT":
			to := strings.Trim(strings.TrimPrefix(arg, "TO:"), "<>")
			if from == "" {
				reply("503 5.5.1 need MAIL")
			} else if code, ok := s.rejectTo[to]; ok {
				reply(strconv.Itoa(code) + " rejected")
			} else {
				rcpts = append(rcpts, strings.ToLower(to))
				reply("250 2.1.5 ok")
			}
		case "RSET":
			from, rcpts = "", nil
			reply("250 2.0.0 ok")
		case "DATA":
			if len(rcpts) == 0 {
				reply("554 5.5.1 no valid recipients")
				continue
			}
			reply("354 go ahead")
			var msg bytes.Buffer
			fmt.Fprintf(&msg, "Return-Path: %s\r\nReceived: from client\r\n\tby fake; today\r\n", from)
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return false
				}
				s.logf("C: %s\n", strings.TrimRight(l, "\r\n"))
				if l == ".\r\n" {
					break
				}
				if strings.HasPrefix(l, ".") {
					l = l[1:]
				}
				msg.WriteString(l)
			}
			s.mu.Lock()
			s.mu.dataCount++
			n := s.mu.dataCount
			s.mu.Unlock()
			if s.dieOnData != nil && s.dieOnData(n) {
				return false
			}
			copies := 1
			if s.dupOnData != nil && s.dupOnData(n) {
				copies = 2
			}
			s.mu.Lock()
			if s.hold {
				s.mu.held++
				rcpts = nil
			}
			for _, rc := range rcpts {
				for range copies {
					s.mu.boxes[rc] = append(s.mu.boxes[rc], bytes.Clone(msg.Bytes()))
				}
			}
			s.mu.Unlock()
			from, rcpts = "", nil
			reply("250 2.0.0 queued")
		case "QUIT":
			s.mu.Lock()
			s.mu.smtpQuits++
			s.mu.Unlock()
			reply("221 bye")
			return true
		default:
			reply("500 5.5.2 unknown command")
		}
	}
}

func (s *fakeServer) pop3Session(r *bufio.Reader, w *bufio.Writer) bool {
	send := func(line string) bool {
		w.WriteString(line + "\r\n")
		if r.Buffered() == 0 {
			return w.Flush() == nil
		}
		return true
	}
	send("+OK fake POP3")
	var user string
	var box [][]byte
	var deleted map[int]bool
	locked := false
	defer func() {
		if locked {
			s.mu.Lock()
			delete(s.mu.locked, user)
			s.mu.Unlock()
		}
	}()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return false
		}
		verb, arg, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
		if s.noPipe && r.Buffered() > 0 {
			// RFC 2449 section 6.6: without PIPELINING the client waits.
			s.t.Errorf("pop3: %s pipelined though PIPELINING was not advertised", verb)
			send("-ERR pipelined")
			return false
		}
		switch strings.ToUpper(verb) {
		case "CAPA":
			w.WriteString("+OK\r\nUSER\r\nRESP-CODES\r\n")
			if !s.noPipe {
				w.WriteString("PIPELINING\r\n")
			}
			send(".")
		case "USER":
			user = arg
			send("+OK")
		case "PASS":
			if pw, ok := s.passwords[user]; !ok || pw != arg {
				send("-ERR [AUTH] no")
				continue
			}
			s.mu.Lock()
			if s.mu.locked[user] {
				s.mu.Unlock()
				send("-ERR [IN-USE] maildrop locked")
				continue
			}
			s.mu.locked[user], locked = true, true
			box = append([][]byte(nil), s.mu.boxes[strings.ToLower(user)]...)
			s.mu.Unlock()
			deleted = map[int]bool{}
			send("+OK logged in")
		case "STAT":
			size := 0
			for _, m := range box {
				size += len(m)
			}
			send(fmt.Sprintf("+OK %d %d", len(box), size))
		case "RETR":
			n, err := strconv.Atoi(arg)
			if err != nil || n < 1 || n > len(box) {
				send("-ERR no such message")
				continue
			}
			w.WriteString("+OK\r\n")
			for _, l := range bytes.SplitAfter(box[n-1], []byte("\r\n")) {
				if len(l) > 0 && l[0] == '.' {
					w.WriteByte('.')
				}
				w.Write(l)
			}
			send(".")
		case "DELE":
			n, err := strconv.Atoi(arg)
			if err != nil || n < 1 || n > len(box) || deleted[n] {
				send("-ERR no such message")
				continue
			}
			deleted[n] = true
			send("+OK deleted")
		case "QUIT":
			// RFC 1939 section 6: the UPDATE state removes what was deleted.
			// Deliveries only append, so the snapshot is a prefix of the box.
			if len(deleted) > 0 {
				s.mu.Lock()
				key := strings.ToLower(user)
				var keep [][]byte
				for i, m := range s.mu.boxes[key] {
					if !deleted[i+1] {
						keep = append(keep, m)
					}
				}
				s.mu.boxes[key] = keep
				s.mu.Unlock()
			}
			send("+OK bye")
			return true
		default:
			send("-ERR unknown")
		}
	}
}

// smtpSessions returns the SMTP connections accepted and those ended by
// QUIT so far.
func (s *fakeServer) smtpSessions() (conns, quits int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.smtpConns, s.mu.smtpQuits
}
