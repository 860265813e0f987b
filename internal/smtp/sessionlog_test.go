package smtp

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestSessionLogAttributes: every record a session writes carries its
// proto, session and remote attributes, as slog.Logger.With gave them,
// and each session has an ID of its own.
func TestSessionLogAttributes(t *testing.T) {
	var logs syncBuffer
	srv := newTestServer(t, &testBackend{})
	srv.Logger = slog.New(slog.NewTextHandler(&logs, nil)).With("listener", "smtp")
	addr := startServer(t, srv, nil)
	var locals []string
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		locals = append(locals, c.LocalAddr().String())
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		br := bufio.NewReader(c)
		expect := func(n int) {
			t.Helper()
			for n > 0 {
				l, err := br.ReadString('\n')
				if err != nil || l[0] != '2' && l[0] != '3' {
					t.Fatalf("reply %q, %v", l, err)
				}
				if l[3] == ' ' {
					n--
				}
			}
		}
		expect(1)
		_, _ = io.WriteString(c, "EHLO client.example\r\nMAIL FROM:<s@remote.example>\r\nRCPT TO:<alice@example.org>\r\nDATA\r\n")
		expect(4)
		_, _ = io.WriteString(c, "Subject: x\r\n\r\nbody\r\n.\r\nQUIT\r\n")
		expect(2)
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("after QUIT: %v, want EOF", err)
		}
		c.Close()
	}
	var sessions []string
	re := regexp.MustCompile(`^time=\S+ level=INFO msg=message listener=smtp proto=smtp session=([A-Z2-7]{16}) remote=(\S+) id=[A-Z2-7]{16} from=s@remote.example rcpts=1 err=<nil>$`)
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("record %q", line)
			continue
		}
		if want := locals[len(sessions)]; m[2] != want {
			t.Errorf("remote=%s, want %s", m[2], want)
		}
		sessions = append(sessions, m[1])
	}
	if len(sessions) != 2 || sessions[0] == sessions[1] {
		t.Errorf("session IDs %q: want two distinct", sessions)
	}
}
