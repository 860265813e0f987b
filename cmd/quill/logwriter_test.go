package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/config"
)

// recorder is an io.Writer that keeps each Write apart and signals it.
type recorder struct {
	mu     sync.Mutex
	writes []string
	wrote  chan struct{}
}

func newRecorder() *recorder { return &recorder{wrote: make(chan struct{}, 100)} }

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, string(p))
	r.wrote <- struct{}{}
	return len(p), nil
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.writes...)
}

func TestLogWriterBatchesUntilWarn(t *testing.T) {
	rec := newRecorder()
	log, closeLog := newLogger(config.Log{Level: "info", Format: "text", FlushInterval: config.Duration{Duration: time.Hour}}, rec)
	log.Info("one")
	log.Info("two")
	if w := rec.all(); len(w) != 0 {
		t.Fatalf("info records written before a flush: %q", w)
	}
	log.Warn("three")
	w := rec.all()
	if len(w) != 1 {
		t.Fatalf("a warning should write the batch in one write; got %q", w)
	}
	lines := strings.Split(strings.TrimSuffix(w[0], "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "msg=one") || !strings.Contains(lines[2], "msg=three") {
		t.Fatalf("batch = %q, want the three records in order", w[0])
	}
	log.Info("four")
	closeLog()
	closeLog() // twice is harmless
	if w := rec.all(); len(w) != 2 || !strings.Contains(w[1], "msg=four") {
		t.Fatalf("Close should write what is held back; got %q", w)
	}
}

func TestLogWriterFlushesOnTheInterval(t *testing.T) {
	rec := newRecorder()
	log, closeLog := newLogger(config.Log{Level: "info", Format: "json", FlushInterval: config.Duration{Duration: time.Millisecond}}, rec)
	defer closeLog()
	log.Info("held")
	select {
	case <-rec.wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("the periodic flush never wrote the record")
	}
	if w := rec.all(); len(w) != 1 || !strings.Contains(w[0], `"msg":"held"`) {
		t.Fatalf("writes = %q", w)
	}
}

func TestLogWriterBoundsItsBuffer(t *testing.T) {
	rec := newRecorder()
	lw := newLogWriter(rec, time.Hour)
	defer lw.Close()
	line := []byte(strings.Repeat("x", 1023) + "\n")
	for range logWriterMax / len(line) {
		lw.Write(line)
	}
	w := rec.all()
	if len(w) != 1 || len(w[0]) != logWriterMax {
		t.Fatalf("after %d buffered bytes: %d writes", logWriterMax, len(w))
	}
}

func TestLogUnbuffered(t *testing.T) {
	var b bytes.Buffer
	log, closeLog := newLogger(config.Log{Level: "info", Format: "text"}, &b)
	defer closeLog()
	log.With("session", 7).Info("now")
	if !strings.Contains(b.String(), "msg=now session=7") {
		t.Fatalf("flush_interval 0 should write at once; got %q", b.String())
	}
	if _, ok := log.Handler().(*textHandler); !ok {
		t.Fatalf("handler %T, want the plain text handler", log.Handler())
	}
}

// BenchmarkLogRecord is the per-message log line of an SMTP delivery,
// written to a file as quill serve's standard error usually is: at once
// (interval 0) and batched (the default interval).
func BenchmarkLogRecord(b *testing.B) {
	for _, iv := range []time.Duration{0, config.Default().Log.FlushInterval.Duration} {
		b.Run("flush_interval="+iv.String(), func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "quill.log"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			log, closeLog := newLogger(config.Log{Level: "info", Format: "text", FlushInterval: config.Duration{Duration: iv}}, f)
			defer closeLog()
			log = log.With("proto", "smtp", "session", "0123456789abcdef", "remote", "127.0.0.1:54321")
			b.ReportAllocs()
			for b.Loop() {
				log.Info("message", "id", "0123456789abcdef0123456789abcdef", "from", "loadgen@quill-load.invalid", "rcpts", 1, "err", nil)
			}
		})
	}
}
