package smtp

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
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
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU(b)
	for b.Loop() {
		_, _ = io.WriteString(bw, "MAIL FROM:<s@remote.example>\r\nRCPT TO:<alice@example.org>\r\nDATA\r\n")
		_ = bw.Flush()
		expect(3)
		_, _ = io.WriteString(bw, body)
		_ = bw.Flush()
		expect(1)
	}
	cpu.report()
	b.StopTimer()
	_, _ = io.WriteString(c, "QUIT\r\n")
	expect(1)
}

// BenchmarkSMTPConnection is BenchmarkSMTPTransaction with one message per
// connection, as Porcupine and postal send: connect, greeting, EHLO, MAIL,
// RCPT, DATA, QUIT, close. Its ns/op over BenchmarkSMTPTransaction's is
// what a connection costs beyond its message (accept, session setup,
// greeting, EHLO, QUIT, teardown), client side included; so are its
// allocs/op over BenchmarkSMTPTransaction's (the client's net.Dial makes
// about 20 of them).
func BenchmarkSMTPConnection(b *testing.B) {
	srv := newTestServer(b, &testBackend{discard: true})
	srv.Logger = slog.New(slog.DiscardHandler)
	addr := startServer(b, srv, nil)
	body := "Subject: bench\r\n\r\n" + strings.Repeat(strings.Repeat("x", 78)+"\r\n", 4096/80) + ".\r\n"
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	br := bufio.NewReaderSize(nil, 4096)
	bw := bufio.NewWriterSize(nil, 8192)
	expect := func(n int, want byte) {
		for n > 0 {
			l, err := br.ReadString('\n')
			if err != nil {
				b.Fatal(err)
			}
			if len(l) < 4 || l[0] != want && !(want == '2' && l[0] == '3') {
				b.Fatalf("reply %q", l)
			}
			if l[3] == ' ' {
				n--
			}
		}
	}
	cpu := startCPU(b)
	for b.Loop() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		br.Reset(c)
		bw.Reset(c)
		expect(1, '2')
		_, _ = io.WriteString(bw, "EHLO bench.example\r\n")
		_ = bw.Flush()
		expect(1, '2')
		_, _ = io.WriteString(bw, "MAIL FROM:<s@remote.example>\r\nRCPT TO:<alice@example.org>\r\nDATA\r\n")
		_ = bw.Flush()
		expect(3, '2')
		_, _ = io.WriteString(bw, body)
		_ = bw.Flush()
		expect(1, '2')
		_, _ = io.WriteString(bw, "QUIT\r\n")
		_ = bw.Flush()
		expect(1, '2')
		c.Close()
	}
	cpu.report()
}

// cpuMeter reports the process's CPU time per operation (client and server
// together) as cpu-ns/op: on a machine shared with other work it varies
// far less than ns/op, which includes waiting for a CPU.
type cpuMeter struct {
	b     *testing.B
	start time.Duration
}

func startCPU(b *testing.B) cpuMeter { return cpuMeter{b, processCPU(b)} }

func (m cpuMeter) report() {
	m.b.ReportMetric(float64(processCPU(m.b)-m.start)/float64(m.b.N), "cpu-ns/op")
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
