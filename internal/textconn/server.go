package textconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("textconn: server closed")

// Handler serves one connection and returns when it is done; the Server
// closes nc afterwards. ctx is cancelled when the Server is closed (a hard
// stop: abandon work). shutdown is closed when a graceful Shutdown begins:
// finish the command in progress, tell an idle client goodbye and return
// (Conn.WatchShutdown does the waking).
type Handler func(ctx context.Context, nc net.Conn, shutdown <-chan struct{})

// Server is the accept loop shared by every front end: it applies the
// connection Limiter, keeps the connection metrics, recovers a panicking
// handler (logged with its stack; only that connection is lost) and
// implements Serve / Shutdown / Close in the manner of net/http.
// Set the fields before the first Serve.
type Server struct {
	Name    string // listener name for logs
	Handler Handler
	Logger  *slog.Logger // nil: slog.Default()
	Metrics *Metrics     // may be nil
	Limiter *Limiter     // may be nil
	// LimitReply is written to a connection refused by the Limiter before
	// it is closed, e.g. "421 4.7.0 Too many connections\r\n".
	LimitReply string
	// OverloadReply is written instead to a connection refused because
	// the node is overloaded (Limiter.ShedWhen), e.g. "421 4.3.2 Service
	// overloaded\r\n"; empty means LimitReply.
	OverloadReply string

	wg sync.WaitGroup // one per worker goroutine and per Serve
	// work hands an accepted connection to an idle worker (unbuffered: a
	// send succeeds only when one is waiting); idle counts those waiting;
	// done is closed when shutdown begins, and idle workers exit.
	work chan accepted
	idle atomic.Int32
	done chan struct{}
	mu   struct {
		sync.Mutex
		init      bool
		ctx       context.Context
		cancel    context.CancelFunc
		shutdown  chan struct{}
		signal    *shutdownSignal // the connections watching shutdown
		closing   bool
		listeners map[net.Listener]struct{}
		conns     map[net.Conn]struct{}
	}
}

func (s *Server) initLocked() {
	if s.mu.init {
		return
	}
	s.mu.init = true
	s.mu.ctx, s.mu.cancel = context.WithCancel(context.Background())
	s.mu.shutdown = make(chan struct{})
	s.work = make(chan accepted)
	s.done = s.mu.shutdown
	s.mu.signal = newShutdownSignal()
	shutdownSignals.Store((<-chan struct{})(s.mu.shutdown), s.mu.signal)
	s.mu.listeners = make(map[net.Listener]struct{})
	s.mu.conns = make(map[net.Conn]struct{})
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

// Serve accepts connections on ln until Shutdown or Close, serving each on
// a goroutine of its own (a worker that served an earlier connection, or a
// new one), and returns ErrServerClosed then. It closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.initLocked()
	if s.mu.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.mu.listeners[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.mu.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.mu.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTooManyFiles) {
				// Transient (EMFILE and the like): back off as net/http does
				// rather than spin.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logger().Warn("accept failed; retrying", "listener", s.Name, "err", err, "backoff", backoff)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-s.mu.shutdown:
					t.Stop()
				}
				continue
			}
			return fmt.Errorf("textconn: accept on %s: %w", s.Name, err)
		}
		backoff = 0
		s.start(nc)
	}
}

// maxIdleWorkers bounds the goroutines a Server keeps waiting for its next
// connection. A goroutine serving a session grows its stack (the store's
// lookups are deep); a new one per connection grew it anew every time
// (runtime.copystack, about 3% of the server's CPU with one message per
// SMTP connection), so a worker that has served a connection waits for
// the next instead of exiting, unless this many already wait. An idle
// worker holds only what the collector leaves of its stack.
const maxIdleWorkers = 64

// accepted is a connection handed to a worker with its Limiter verdict.
type accepted struct {
	nc       net.Conn
	ticket   ticket  // the Limiter's, if admitted
	refused  refusal // admitted, or why not
	ctx      context.Context
	shutdown <-chan struct{}
}

func (s *Server) start(nc net.Conn) {
	t, r := s.Limiter.acquire(addrPort(nc.RemoteAddr()).Addr())
	s.mu.Lock()
	if s.mu.closing {
		s.mu.Unlock()
		nc.Close()
		if r == admitted {
			s.Limiter.release(t)
		}
		return
	}
	s.mu.conns[nc] = struct{}{}
	a := accepted{nc: nc, ticket: t, refused: r, ctx: s.mu.ctx, shutdown: s.mu.shutdown}
	s.mu.Unlock()

	select {
	case s.work <- a: // an idle worker took it
	default:
		// Serve holds a count on wg, so adding here cannot race with
		// Shutdown's Wait.
		s.wg.Add(1)
		go s.worker(a)
	}
}

// worker serves a, then each connection handed to it, until more than
// maxIdleWorkers wait or the Server shuts down.
func (s *Server) worker(a accepted) {
	defer s.wg.Done()
	for {
		s.serveConn(a)
		if s.idle.Add(1) > maxIdleWorkers {
			s.idle.Add(-1)
			return
		}
		select {
		case a = <-s.work:
			s.idle.Add(-1)
		case <-s.done:
			s.idle.Add(-1)
			return
		}
	}
}

// serveConn runs the Handler on one connection (or refuses it for the
// Limiter), recovering a panic, and closes it.
func (s *Server) serveConn(a accepted) {
	nc := a.nc
	defer func() {
		s.mu.Lock()
		delete(s.mu.conns, nc)
		s.mu.Unlock()
		nc.Close()
	}()
	if a.refused != admitted {
		s.Metrics.reject()
		reply := s.LimitReply
		if a.refused == overloaded {
			// The monitor logs the overload once; a line per refused
			// connection would add to it.
			if s.OverloadReply != "" {
				reply = s.OverloadReply
			}
		} else {
			s.logger().Info("connection refused: limit reached", "listener", s.Name, "remote", nc.RemoteAddr().String())
		}
		if reply != "" {
			_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
			_, _ = nc.Write([]byte(reply))
		}
		return
	}
	defer s.Limiter.release(a.ticket)
	s.Metrics.opened()
	defer s.Metrics.closed()
	defer func() {
		if r := recover(); r != nil {
			s.logger().Error("panic serving connection", "listener", s.Name,
				"remote", nc.RemoteAddr().String(), "panic", r, "stack", string(debug.Stack()))
		}
	}()
	s.Handler(a.ctx, nc, a.shutdown)
}

// Shutdown stops accepting, signals every connection to finish (idle ones
// are told goodbye by their handler) and waits until all have returned or
// ctx is done; then it closes whatever remains and returns ctx.Err().
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.initLocked()
	s.beginShutdownLocked()
	for ln := range s.mu.listeners {
		ln.Close()
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.mu.Lock()
		s.mu.cancel()
		s.mu.Unlock()
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return ctx.Err()
	}
}

// Close stops accepting, cancels every handler's context and closes every
// connection now. It does not wait for handlers to return; Shutdown does.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.beginShutdownLocked()
	s.mu.cancel()
	for ln := range s.mu.listeners {
		ln.Close()
	}
	for nc := range s.mu.conns {
		nc.Close()
	}
	return nil
}

// beginShutdownLocked closes the shutdown channel and signals the
// connections watching it (Conn.WatchShutdown), once.
func (s *Server) beginShutdownLocked() {
	if s.mu.closing {
		return
	}
	s.mu.closing = true
	close(s.mu.shutdown)
	shutdownSignals.Delete((<-chan struct{})(s.mu.shutdown))
	s.mu.signal.fire()
}
