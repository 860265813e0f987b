package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// logWriter batches log records into few writes: Write appends to a buffer
// and the buffer reaches w when it holds logWriterMax bytes, when a record
// of level Warn or above has just been added (logFlusher), every interval,
// and on Close. A record is written whole by one Write (slog's handlers
// write each record with one call), so batches never split a line.
//
// Its cost: the records of the last interval are lost if the process is
// killed (kill -9, power loss) before they are written, as with any
// asynchronous log transport (syslog, journald). Mail never depends on
// them; what a 250 means is in the store.
type logWriter struct {
	mu   sync.Mutex
	w    io.Writer
	buf  []byte
	stop chan struct{}
	done chan struct{}
	once sync.Once // Close
}

// logWriterMax is the buffered bytes that make a Write pass the batch on
// at once: bounded memory under any burst of records.
const logWriterMax = 64 << 10

func newLogWriter(w io.Writer, interval time.Duration) *logWriter {
	lw := &logWriter{w: w, stop: make(chan struct{}), done: make(chan struct{})}
	go lw.loop(interval)
	return lw
}

func (lw *logWriter) loop(interval time.Duration) {
	defer close(lw.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			lw.Flush()
		case <-lw.stop:
			return
		}
	}
}

func (lw *logWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.buf = append(lw.buf, p...)
	if len(lw.buf) >= logWriterMax {
		lw.flushLocked()
	}
	return len(p), nil
}

// Flush writes what is buffered.
func (lw *logWriter) Flush() {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.flushLocked()
}

func (lw *logWriter) flushLocked() {
	if len(lw.buf) == 0 {
		return
	}
	// An error is dropped, as slog drops a handler's: there is nowhere
	// else to report it.
	lw.w.Write(lw.buf)
	if cap(lw.buf) > 2*logWriterMax {
		lw.buf = nil // shed a burst's buffer
	} else {
		lw.buf = lw.buf[:0]
	}
}

// Close stops the periodic flush and writes what is buffered. Writes after
// Close go out with the next Flush or Close.
func (lw *logWriter) Close() {
	lw.once.Do(func() { close(lw.stop) })
	<-lw.done
	lw.Flush()
}

// logFlusher passes every record to its handler and flushes the writer
// after each one at level Warn or above, so that warnings and errors are
// never held back.
type logFlusher struct {
	slog.Handler
	w *logWriter
}

func (h logFlusher) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		h.w.Flush()
	}
	return err
}

func (h logFlusher) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logFlusher{h.Handler.WithAttrs(attrs), h.w}
}

func (h logFlusher) WithGroup(name string) slog.Handler {
	return logFlusher{h.Handler.WithGroup(name), h.w}
}
