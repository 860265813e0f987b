package smtp

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// BenchmarkSMTPTransaction measures one MAIL/RCPT/DATA transaction of a
// 4 KiB message over loopback against a backend that discards the body:
// the protocol layer's cost without storage (the "no-storage sink").
func BenchmarkSMTPTransaction(b *testing.B) {
	srv := newTestServer(b, &testBackend{discard: true})
	srv.Logger = slog.New(slog.DiscardHandler)
	addr := startServer(b, srv, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	bw := bufio.NewWriter(c)
	expect := func(n int) {
		for n > 0 {
			l, err := br.ReadString('\n')
			if err != nil {
				b.Fatal(err)
			}
			if l[0] != '2' && l[0] != '3' {
				b.Fatalf("reply %q", l)
			}
			if l[3] == ' ' {
				n--
			}
		}
	}
	_ = c.SetDeadline(time.Now().Add(time.Hour))
	expect(1)
	_, _ = io.WriteString(bw, "EHLO bench.example\r\n")
	_ = bw.Flush()
	expect(1)
	body := "Subject: bench\r\n\r\n" + strings.Repeat(strings.Repeat("x", 78)+"\r\n", 4096/80) + ".\r\n"
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for b.Loop() {
		_, _ = io.WriteString(bw, "MAIL FROM:<s@remote.example>\r\nRCPT TO:<alice@example.org>\r\nDATA\r\n")
		_ = bw.Flush()
		expect(3)
		_, _ = io.WriteString(bw, body)
		_ = bw.Flush()
		expect(1)
	}
	b.StopTimer()
	_, _ = io.WriteString(c, "QUIT\r\n")
	expect(1)
}
