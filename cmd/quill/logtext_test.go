package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/netip"
	"testing"
	"time"
)

type nilPtrErr struct{ msg string }

func (e *nilPtrErr) Error() string { return e.msg }

// FuzzTextHandler holds textHandler to slog.TextHandler's bytes, on the
// fast path and off it (groups, values of other kinds, odd keys, an error
// whose Error panics).
func FuzzTextHandler(f *testing.F) {
	f.Add("message", "id", "0123456789abcdef", int64(1), 0.5, true, int64(1500), int64(0), "loadgen@quill-load.invalid", uint8(0), int64(1764165296123456789))
	f.Add("", "", "", int64(-1), math.Inf(1), false, int64(0), int64(4), "a b=c\"d\\e\x00\u00a0é\xff", uint8(1), int64(0))
	f.Add("pop3: logged in", "user", "u@example.test", int64(math.MinInt64), math.NaN(), true, int64(-1), int64(-4), "\u2028", uint8(2), int64(-1))
	f.Add("x=y", "k=", "=", int64(42), 1e21, false, int64(3600e9), int64(8), "\t", uint8(3), int64(1<<62))
	f.Fuzz(func(t *testing.T, msg, key, sval string, ival int64, fval float64, bval bool, dur, level int64, wval string, shape uint8, unix int64) {
		var fast, want bytes.Buffer
		opts := &slog.HandlerOptions{Level: slog.LevelDebug}
		hf, hw := newTextHandler(&fast, opts), slog.Handler(slog.NewTextHandler(&want, opts))
		if _, ok := hf.(*textHandler); !ok {
			t.Fatalf("handler %T", hf)
		}
		with := []slog.Attr{slog.String("session", wval), slog.String(key, sval)}
		if shape&4 != 0 {
			with = append(with, slog.Any("remote", netip.MustParseAddrPort("127.0.0.1:25")))
		}
		hf, hw = hf.WithAttrs(with), hw.WithAttrs(with)
		if shape&8 != 0 {
			hf, hw = hf.WithGroup(wval), hw.WithGroup(wval)
		}
		var err error
		switch shape & 3 {
		case 1:
			err = errors.New(sval)
		case 2:
			err = (*nilPtrErr)(nil)
		case 3:
			err = &nilPtrErr{wval}
		}
		tm := time.Unix(0, unix)
		if shape&16 != 0 {
			tm = tm.In(time.FixedZone("X", -(3*3600 + 30*60)))
		}
		if shape&32 != 0 {
			tm = time.Time{}
		}
		r := slog.NewRecord(tm, slog.Level(level), msg, 0)
		r.AddAttrs(slog.String(key, sval), slog.Int64("n", ival), slog.Uint64("u", uint64(ival)),
			slog.Float64("f", fval), slog.Bool("b", bval), slog.Duration("d", time.Duration(dur)),
			slog.Any("err", err), slog.Any("none", nil))
		if shape&64 != 0 {
			r.AddAttrs(slog.Group("g", slog.String("k", sval)), slog.Any("bytes", []byte(sval)))
		}
		ctx := context.Background()
		if e1, e2 := hf.Handle(ctx, r), hw.Handle(ctx, r); (e1 == nil) != (e2 == nil) {
			t.Fatalf("errors differ: %v, %v", e1, e2)
		}
		if fast.String() != want.String() {
			t.Fatalf("textHandler wrote\n%q\nslog.TextHandler\n%q", fast.String(), want.String())
		}
	})
}

// BenchmarkTextHandler is a delivery's log line through textHandler and
// through slog.TextHandler, into memory.
func BenchmarkTextHandler(b *testing.B) {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	for _, c := range []struct {
		name string
		h    slog.Handler
	}{{"quill", newTextHandler(discard{}, opts)}, {"slog", slog.NewTextHandler(discard{}, opts)}} {
		b.Run(c.name, func(b *testing.B) {
			log := slog.New(c.h).With("proto", "smtp", "session", "0123456789abcdef", "remote", "127.0.0.1:54321")
			b.ReportAllocs()
			for b.Loop() {
				log.Info("message", "id", "0123456789abcdef0123456789abcdef", "from", "loadgen@quill-load.invalid", "rcpts", 1, "err", nil)
			}
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
