// Package textconn provides what every line-oriented text protocol front end
// (SMTP, LMTP, POP3, IMAP) needs below its state machine: a connection with
// bounded line reads and per-operation deadlines, the STARTTLS upgrade, an
// accept loop with graceful shutdown and panic recovery, connection limits
// per remote address and in total, and the shared front-end metrics.
package textconn

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
)

// ErrLineTooLong is returned by ReadLine for a line longer than
// Options.MaxLine. The rest of the line has been consumed and discarded, so
// the caller may reply and keep reading.
var ErrLineTooLong = errors.New("textconn: line too long")

// ErrShutdown is returned by ReadLine once the shutdown signal given to
// WatchShutdown has fired and no complete line is buffered: the caller
// should say goodbye (421, -ERR, * BYE) and return.
var ErrShutdown = errors.New("textconn: server shutting down")

// ErrTooSlow is returned by reads during a transfer (BeginTransfer) once
// the peer has fallen below the minimum rate. It satisfies
// errors.Is(err, os.ErrDeadlineExceeded), so callers that handle timeouts
// handle it too; the connection is out of step and must be closed.
var ErrTooSlow = fmt.Errorf("textconn: transfer slower than the minimum rate: %w", os.ErrDeadlineExceeded)

// Options bound a Conn. Zero durations mean no deadline.
type Options struct {
	MaxLine      int           // longest accepted line in octets, CRLF excluded
	ReadTimeout  time.Duration // deadline for each ReadLine (idle / per-command timeout)
	WriteTimeout time.Duration // deadline for each write to the network (each Flush)
	// HandshakeTimeout bounds a TLS handshake; 0 means ReadTimeout.
	HandshakeTimeout time.Duration
	// Metrics, if not nil, counts the bytes received and sent on the wire
	// (TLS records included).
	Metrics *Metrics
	// ReleaseIdle hands the input buffer back to its pool whenever
	// ReadLine waits for a client with nothing buffered, and the output
	// buffer whenever Flush empties it, and takes them again when needed:
	// an idle connection then holds idleReadSize octets instead of its
	// buffers (IMAP's line buffer is 64 KiB). It costs a pool round trip per command, and a second read
	// for a command longer than idleReadSize. A caller that keeps what
	// Reader returned across a ReadLine must not set it.
	ReleaseIdle bool
}

// idleReadSize is the read buffer of a connection that released its
// buffers (Options.ReleaseIdle): it holds most commands whole.
const idleReadSize = 512

// DefaultMaxLine is used when Options.MaxLine is not positive.
const DefaultMaxLine = 8192

// Conn is a line-oriented text protocol connection. It is used by one
// goroutine, apart from WatchShutdown's signal and Close, which may come from
// any goroutine.
//
// Reads have two deadline regimes: ReadLine gives the whole line
// ReadTimeout (a client cannot hold a command open by trickling bytes),
// while reads through Reader() renew the deadline on every network read
// (bodies are long; only a stalled peer times out).
type Conn struct {
	raw net.Conn // the accepted connection, counting bytes; deadlines are set on it
	nc  net.Conn // raw, or the *tls.Conn over it
	// rw is the byte stream under br and bw: nc, or what Wrap put over it.
	rw io.ReadWriter
	// wrapped is set by Wrap; TLS can no longer start beneath the wrapper.
	wrapped bool
	// dirty is set when bytes went into rw since its last Flush, so that
	// an idle Flush does not make a wrapper emit an empty block.
	dirty bool
	// br and bw are nil while released (Options.ReleaseIdle); reader and
	// writer take them again, of sizes rsize and wsize.
	br           *bufio.Reader
	bw           *bufio.Writer
	rsize, wsize int
	// idle receives the first input after the buffers were released;
	// pending is what of it br has not consumed yet (inputReader).
	idle    [idleReadSize]byte
	pending []byte
	opts    Options
	remote  netip.AddrPort
	tls     *tls.ConnectionState

	readTimeout time.Duration
	// lineDeadline is true while ReadLine runs: the deadline it set covers
	// the whole line and must not be renewed per network read.
	lineDeadline bool
	// rdl and wdl are the read and write deadlines last set on raw (zero:
	// unknown or none), so that renewing one can be skipped: see renew.
	rdl, wdl time.Time
	// xfer is the minimum-rate accounting of a transfer (BeginTransfer);
	// rate 0 when none is in progress.
	xfer transfer

	mu struct {
		sync.Mutex
		shutdown bool // the shutdown signal fired
		inLine   bool // ReadLine is waiting for input
	}
}

// New wraps c. The caller keeps ownership of c through the Conn: Close
// closes it.
func New(c net.Conn, opts Options) *Conn {
	if opts.MaxLine <= 0 {
		opts.MaxLine = DefaultMaxLine
	}
	tc := &Conn{opts: opts, readTimeout: opts.ReadTimeout}
	tc.raw = c
	if opts.Metrics != nil {
		tc.raw = &countingConn{Conn: c, m: opts.Metrics}
	}
	tc.nc = tc.raw
	tc.rw = tc.raw
	tc.remote = addrPort(c.RemoteAddr())
	// The buffer must hold a maximal line plus CRLF so that ReadSlice can
	// return it whole; 4 KiB keeps syscalls few for short lines.
	tc.rsize, tc.wsize = max(4096, opts.MaxLine+2), 4096
	tc.br = newReader(inputReader{tc}, tc.rsize)
	tc.bw = newWriter(deadlineWriter{tc}, tc.wsize)
	return tc
}

// reader returns the input buffer, taking one from the pool if released.
func (c *Conn) reader() *bufio.Reader {
	if c.br == nil {
		c.br = newReader(inputReader{c}, c.rsize)
	}
	return c.br
}

// writer returns the output buffer, taking one from the pool if released.
func (c *Conn) writer() *bufio.Writer {
	if c.bw == nil {
		c.bw = newWriter(deadlineWriter{c}, c.wsize)
	}
	return c.bw
}

// releaseInput hands back the input buffer of a connection about to wait
// for input with none buffered (Options.ReleaseIdle). It touches only the
// read side: a reader goroutine may wait in ReadLine while another writes
// (IMAP IDLE). The output buffer is handed back by Flush.
func (c *Conn) releaseInput() {
	putReader(c.br)
	c.br = nil
}

// inputReader is what br reads from: the input that arrived while the
// buffers were released, then the network.
type inputReader struct{ c *Conn }

func (r inputReader) Read(p []byte) (int, error) {
	if c := r.c; len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return deadlineReader(r).Read(p)
}

// readers and writers hold released buffers for reuse, one sync.Pool per
// buffer size. A POP3 session lasts one retrieval, and allocating and
// zeroing its buffers (40 KiB once its output buffer has grown for bodies)
// was the largest share of what the server allocated under the benchmark's
// mix.
var readers, writers sizedPools

// sizedPools maps a buffer size to its pool; a process uses a few sizes.
type sizedPools struct {
	mu sync.RWMutex
	m  map[int]*sync.Pool
}

func poolOf(sp *sizedPools, size int) *sync.Pool {
	sp.mu.RLock()
	p := sp.m[size]
	sp.mu.RUnlock()
	if p != nil {
		return p
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.m == nil {
		sp.m = make(map[int]*sync.Pool)
	}
	if sp.m[size] == nil {
		sp.m[size] = new(sync.Pool)
	}
	return sp.m[size]
}

func newReader(r io.Reader, size int) *bufio.Reader {
	if br, ok := poolOf(&readers, size).Get().(*bufio.Reader); ok {
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, size)
}

func newWriter(w io.Writer, size int) *bufio.Writer {
	if bw, ok := poolOf(&writers, size).Get().(*bufio.Writer); ok {
		bw.Reset(w)
		return bw
	}
	return bufio.NewWriterSize(w, size)
}

// putReader and putWriter drop the buffered octets and the reference to
// the Conn, then pool the buffer.
func putReader(br *bufio.Reader) {
	br.Reset(nil)
	poolOf(&readers, br.Size()).Put(br)
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	poolOf(&writers, bw.Size()).Put(bw)
}

// Release hands the connection's buffers back for reuse by later
// connections, discarding unread input and unflushed output. It is the
// owner's last act on c: call it once, from the goroutine that uses c, after
// that goroutine is done with c and with anything obtained from Reader.
func (c *Conn) Release() {
	if c.br != nil {
		putReader(c.br)
		c.br = nil
	}
	if c.bw != nil {
		putWriter(c.bw)
		c.bw = nil
	}
	c.pending = nil
}

func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case nil:
		return netip.AddrPort{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// deadlineReader renews the read deadline before each network read unless
// ReadLine has set one for the whole line.
type deadlineReader struct{ c *Conn }

func (r deadlineReader) Read(p []byte) (int, error) {
	c := r.c
	if c.xfer.rate > 0 {
		return c.transferRead(p)
	}
	if !c.lineDeadline && c.readTimeout > 0 {
		if d, ok := renew(&c.rdl, c.readTimeout); ok {
			_ = c.raw.SetReadDeadline(d)
		}
	}
	return c.rw.Read(p)
}

// renew returns the deadline timeout from now, and records it in *last,
// the deadline last set, unless *last is no later than that and at most
// timeout/32 earlier: then ok is false and the caller leaves it, so that an
// operation may get up to 1/32 less than its timeout (9.4 s of SMTP's 5
// minutes). Setting a deadline re-arms a runtime timer, and setting one
// per line and per write was 2% of the server's CPU under the benchmark's
// mix, where a session's commands come milliseconds apart.
func renew(last *time.Time, timeout time.Duration) (d time.Time, ok bool) {
	d = time.Now().Add(timeout)
	if !last.IsZero() && !last.After(d) && d.Sub(*last) <= timeout/32 {
		return time.Time{}, false
	}
	*last = d
	return d, true
}

// deadlineWriter applies WriteTimeout to each network write.
type deadlineWriter struct{ c *Conn }

func (w deadlineWriter) Write(p []byte) (int, error) {
	w.c.setWriteDeadline()
	w.c.dirty = true
	return w.c.rw.Write(p)
}

func (c *Conn) setWriteDeadline() {
	if c.opts.WriteTimeout > 0 {
		if d, ok := renew(&c.wdl, c.opts.WriteTimeout); ok {
			_ = c.raw.SetWriteDeadline(d)
		}
	}
}

// ReadLine returns the next line without its CRLF (a bare LF also ends a
// line). The slice is valid until the next read. A line longer than MaxLine
// is consumed and discarded and ErrLineTooLong returned, holding at most one
// buffer of it in memory. A timeout satisfies
// errors.Is(err, os.ErrDeadlineExceeded); after the shutdown signal the error
// is ErrShutdown once no complete line is buffered.
func (c *Conn) ReadLine() ([]byte, error) {
	if c.opts.ReleaseIdle && c.br != nil && c.br.Buffered() == 0 {
		c.releaseInput()
	}
	c.mu.Lock()
	shutdown := c.mu.shutdown
	switch {
	case shutdown:
		// Serve complete lines already received; fail at once otherwise.
		_ = c.raw.SetReadDeadline(time.Unix(1, 0))
		c.rdl = time.Time{}
	case c.xfer.rate > 0:
		// Within a transfer (BDAT commands between chunks) the line gets
		// no more than the rest of the transfer's allowance.
		left := c.xfer.left()
		if left <= 0 {
			c.mu.Unlock()
			return nil, ErrTooSlow
		}
		c.xfer.lineBound = c.readTimeout <= 0 || left < c.readTimeout
		if !c.xfer.lineBound {
			left = c.readTimeout
		}
		c.rdl = time.Now().Add(left)
		_ = c.raw.SetReadDeadline(c.rdl)
	case c.readTimeout > 0:
		if d, ok := renew(&c.rdl, c.readTimeout); ok {
			_ = c.raw.SetReadDeadline(d)
		}
	default:
		_ = c.raw.SetReadDeadline(time.Time{})
		c.rdl = time.Time{}
	}
	c.mu.inLine = true
	c.mu.Unlock()
	c.lineDeadline = true

	line, err := c.readLine()

	c.lineDeadline = false
	c.mu.Lock()
	c.mu.inLine = false
	shutdown = c.mu.shutdown
	c.mu.Unlock()
	if shutdown {
		c.rdl = time.Time{} // WatchShutdown may have set one in the past
	}
	if err != nil && shutdown && errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, ErrShutdown
	}
	if err != nil && c.xfer.rate > 0 && c.xfer.lineBound && errors.Is(err, os.ErrDeadlineExceeded) {
		err = ErrTooSlow
	}
	return line, err
}

func (c *Conn) readLine() ([]byte, error) {
	if c.br == nil {
		// Wait for input in the small idle buffer, then take a real one.
		var n int
		var err error
		for n == 0 && err == nil {
			n, err = deadlineReader{c}.Read(c.idle[:])
		}
		if n == 0 {
			return nil, err
		}
		c.pending = c.idle[:n]
	}
	br := c.reader()
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = br.ReadSlice('\n')
		}
		if err != nil {
			return nil, err
		}
		return nil, ErrLineTooLong
	}
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(line) > c.opts.MaxLine {
		return nil, ErrLineTooLong
	}
	return line, nil
}

// HasLine reports whether a complete line is already buffered, so that
// reading it will not block. PIPELINING (RFC 2920 section 3.2) servers flush
// their replies only when it is false.
func (c *Conn) HasLine() bool {
	if c.br == nil {
		return false
	}
	n := c.br.Buffered()
	if n == 0 {
		return false
	}
	b, _ := c.br.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

// Buffered returns the number of input bytes already read ahead.
func (c *Conn) Buffered() int {
	if c.br == nil {
		return 0
	}
	return c.br.Buffered()
}

// transfer is the state of a minimum-rate transfer. The peer is allowed
// grace plus one second per rate octets received, and is charged only for
// the time the server spends waiting for it in network reads: time the
// server spends elsewhere (storing what it read, waiting for memory) is
// not the peer's fault and does not count.
type transfer struct {
	rate      int64         // octets per second; 0: no transfer
	grace     time.Duration // allowance before any octet arrives
	n         int64         // octets received since BeginTransfer
	spent     time.Duration // time spent waiting in network reads
	lineBound bool          // ReadLine's deadline is the allowance's
}

// left returns what remains of the allowance.
func (x *transfer) left() time.Duration {
	allowed := x.grace + time.Duration(float64(x.n)/float64(x.rate)*float64(time.Second))
	return allowed - x.spent
}

// BeginTransfer starts charging reads against a minimum rate: from now until
// EndTransfer, the peer must keep the octets it sends at or above rate per
// second after an initial grace, or reads fail with ErrTooSlow. The read
// timeout still bounds each read. It is meant for message bodies and
// literals (DATA, BDAT, APPEND), where a peer trickling octets would
// otherwise hold the connection, and the transaction's resources, for
// hours. A rate <= 0 disables the check.
func (c *Conn) BeginTransfer(rate int64, grace time.Duration) {
	c.xfer = transfer{rate: max(rate, 0), grace: grace}
}

// EndTransfer ends the transfer begun by BeginTransfer.
func (c *Conn) EndTransfer() { c.xfer = transfer{} }

// transferRead is one network read during a transfer: its deadline is the
// earlier of the read timeout and the end of the allowance, unless
// ReadLine has set one for the whole line.
func (c *Conn) transferRead(p []byte) (int, error) {
	x := &c.xfer
	left := x.left()
	if left <= 0 {
		return 0, ErrTooSlow
	}
	start := time.Now()
	bound := x.lineBound
	if !c.lineDeadline {
		bound = c.readTimeout <= 0 || left < c.readTimeout
		if !bound {
			left = c.readTimeout
		}
		// Skip re-arming the timer when the deadline moved later by a
		// little (see renew): the peer may get up to grace/32 less.
		d := start.Add(left)
		if c.rdl.IsZero() || d.Before(c.rdl) || d.Sub(c.rdl) > x.grace/32 {
			c.rdl = d
			_ = c.raw.SetReadDeadline(d)
		}
	}
	n, err := c.rw.Read(p)
	x.spent += time.Since(start)
	x.n += int64(n)
	if err != nil && bound && errors.Is(err, os.ErrDeadlineExceeded) {
		err = ErrTooSlow
	}
	return n, err
}

// Reader returns the buffered reader for message bodies and literals; the
// caller bounds what it reads. Each network read gets the read timeout.
// The reader is valid until the next ReadLine.
func (c *Conn) Reader() *bufio.Reader { return c.reader() }

// SetReadTimeout changes the read timeout for subsequent reads (for example
// the longer DATA timeout, RFC 5321 section 4.5.3.2.5).
func (c *Conn) SetReadTimeout(d time.Duration) { c.readTimeout = d }

// ReadTimeout returns the current read timeout.
func (c *Conn) ReadTimeout() time.Duration { return c.readTimeout }

// Write buffers p.
func (c *Conn) Write(p []byte) (int, error) { return c.writer().Write(p) }

// WriteString buffers s.
func (c *Conn) WriteString(s string) (int, error) { return c.writer().WriteString(s) }

// GrowWriteBuffer makes the output buffer at least n octets, for a session
// that is about to send message bodies: replies to pipelined retrievals
// then share network writes instead of taking one or more each. Anything
// already buffered is flushed first (one write; nothing is at the usual
// call site, after a drained burst). The buffer never shrinks, so only
// sessions that retrieve pay for it.
func (c *Conn) GrowWriteBuffer(n int) error {
	if c.wsize >= n {
		return nil
	}
	if c.bw != nil {
		if err := c.bw.Flush(); err != nil {
			return err
		}
		putWriter(c.bw)
		c.bw = nil
	}
	c.wsize = n
	return nil
}

// Flush writes buffered output, each network write bounded by WriteTimeout.
// A stream installed by Wrap that has a Flush() error method is flushed
// too, after any output since its last flush.
func (c *Conn) Flush() error {
	if c.bw != nil {
		if err := c.bw.Flush(); err != nil {
			return err
		}
		if c.opts.ReleaseIdle {
			putWriter(c.bw)
			c.bw = nil
		}
	}
	if f, ok := c.rw.(interface{ Flush() error }); ok && c.dirty {
		c.setWriteDeadline()
		if err := f.Flush(); err != nil {
			return err
		}
	}
	c.dirty = false
	return nil
}

// ErrPipelined is returned by Wrap when input beyond the command that asked
// for the new stream has already been read: those bytes were sent under the
// old encoding, and a client may not pipeline past such a command
// (RFC 4978 section 3).
var ErrPipelined = errors.New("textconn: input pipelined past a stream change")

// Wrap replaces the byte stream under the connection's buffers with
// f(current), for a layer such as COMPRESS=DEFLATE (RFC 4978): buffered
// output is flushed through the old stream first, and it refuses with
// ErrPipelined, changing nothing, while input is buffered. The new stream
// sits above TLS when TLS is active, and StartTLS is refused afterwards.
// Deadlines still apply to the network connection beneath it. If the new
// stream has a Flush() error method, Flush calls it after writing, so a
// compressor sends each response burst at once. On a flush error the
// connection is unusable and must be closed.
func (c *Conn) Wrap(f func(io.ReadWriter) io.ReadWriter) error {
	if c.Buffered() > 0 {
		return ErrPipelined
	}
	if err := c.Flush(); err != nil {
		return err
	}
	c.rw = f(c.rw)
	c.wrapped = true
	c.dirty = false
	return nil
}

// StartTLS runs the server side of a TLS handshake on the connection,
// bounded by HandshakeTimeout. Output must have been flushed. Any plaintext
// input read ahead is discarded: a client may not pipeline past STARTTLS
// (RFC 3207 section 4.2, RFC 2595 section 3.1), and honouring such bytes
// would let an attacker inject commands into the protected session.
// Implicit-TLS listeners call it right after New. On error the connection
// is unusable and must be closed.
func (c *Conn) StartTLS(cfg *tls.Config) error {
	if c.tls != nil {
		return errors.New("textconn: TLS already active")
	}
	if c.wrapped {
		return errors.New("textconn: StartTLS beneath a wrapped stream")
	}
	if c.bw != nil && c.bw.Buffered() > 0 {
		return errors.New("textconn: StartTLS with unflushed output")
	}
	c.pending = nil
	if c.br != nil {
		c.br.Reset(inputReader{c})
	}
	tc := tls.Server(c.raw, cfg)
	timeout := c.opts.HandshakeTimeout
	if timeout == 0 {
		timeout = c.opts.ReadTimeout
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	_ = c.raw.SetDeadline(deadline)
	c.rdl, c.wdl = time.Time{}, time.Time{}
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("textconn: TLS handshake: %w", err)
	}
	st := tc.ConnectionState()
	c.nc = tc
	c.rw = tc
	c.tls = &st
	return nil
}

// TLS returns the TLS state, or nil on a plaintext connection.
func (c *Conn) TLS() *tls.ConnectionState { return c.tls }

// RemoteAddr returns the peer's address (IPv4-mapped IPv6 unmapped).
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remote }

// LocalAddr returns the local end's address.
func (c *Conn) LocalAddr() netip.AddrPort { return addrPort(c.raw.LocalAddr()) }

// WatchShutdown arranges for ReadLine to return ErrShutdown once shutdown is
// closed: immediately when it is waiting for a client that is idle, or at
// the next ReadLine otherwise, so a command in progress (a message body)
// completes. stop ends the watch; call it before returning. After stop
// returns, the watch no longer touches c.
//
// The shutdown channel a Server hands its Handler costs no goroutine: the
// connection joins the Server's list, which Shutdown and Close signal (a
// goroutine per connection, started and ended for a session that carries
// one message, was a measurable share of its cost). Any other channel is
// watched by a goroutine of its own.
func (c *Conn) WatchShutdown(shutdown <-chan struct{}) (stop func()) {
	if v, ok := shutdownSignals.Load(shutdown); ok {
		sig := v.(*shutdownSignal)
		if sig.add(c) {
			return func() { sig.remove(c) }
		}
		// Fired already: the channel is closed, which the goroutine
		// below sees at once.
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-shutdown:
			c.signalShutdown()
		case <-done:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-exited
	}
}

// signalShutdown is the shutdown signal: ReadLine returns ErrShutdown from
// now on, and one waiting for input is woken.
func (c *Conn) signalShutdown() {
	c.mu.Lock()
	c.mu.shutdown = true
	if c.mu.inLine {
		_ = c.raw.SetReadDeadline(time.Unix(1, 0))
	}
	c.mu.Unlock()
}

// shutdownSignals maps the shutdown channel of each Server that has not yet
// begun to shut down to its connections' list (Server.initLocked adds it,
// Shutdown and Close remove it as they fire it).
var shutdownSignals sync.Map // <-chan struct{} -> *shutdownSignal

// shutdownSignal is a Server's list of the connections watching its
// shutdown channel.
type shutdownSignal struct {
	mu struct {
		sync.Mutex
		fired bool
		conns map[*Conn]struct{}
	}
}

func newShutdownSignal() *shutdownSignal {
	sig := &shutdownSignal{}
	sig.mu.conns = make(map[*Conn]struct{})
	return sig
}

// add puts c on the list, or reports false once the signal has fired.
func (sig *shutdownSignal) add(c *Conn) bool {
	sig.mu.Lock()
	defer sig.mu.Unlock()
	if sig.mu.fired {
		return false
	}
	sig.mu.conns[c] = struct{}{}
	return true
}

// remove takes c off the list; a fire in progress has finished with c when
// it returns.
func (sig *shutdownSignal) remove(c *Conn) {
	sig.mu.Lock()
	delete(sig.mu.conns, c)
	sig.mu.Unlock()
}

// fire signals every connection on the list, once; later adds fail.
func (sig *shutdownSignal) fire() {
	sig.mu.Lock()
	defer sig.mu.Unlock()
	if sig.mu.fired {
		return
	}
	sig.mu.fired = true
	for c := range sig.mu.conns {
		c.signalShutdown()
	}
	sig.mu.conns = nil
}

// Close closes the connection without flushing.
func (c *Conn) Close() error { return c.nc.Close() }

// countingConn counts wire bytes into Metrics.
type countingConn struct {
	net.Conn
	m *Metrics
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.m.received(n)
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.m.sent(n)
	return n, err
}
