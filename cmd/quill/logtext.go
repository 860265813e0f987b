package main

import (
	"context"
	"encoding"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// textHandler writes exactly what slog.TextHandler writes (without
// ReplaceAttr or AddSource, which quill serve does not use), faster for
// the records Quill logs on every delivery and retrieval: keys without
// groups and values of the kinds below. It hands any other record to a
// slog.TextHandler built with the same options and attributes, and
// FuzzTextHandler holds the two to the same bytes.
//
// Why: under the Porcupine mix slog.TextHandler's Handle was 2.2% of quill
// serve's CPU, most of it generic handling (state, separators, groups,
// the Value switch) around the few appends a delivery's line needs.
type textHandler struct {
	w     io.Writer
	level slog.Leveler
	// pre holds the attributes given to WithAttrs, formatted, each with
	// its leading space; attrs holds them as given.
	pre   []byte
	attrs []slog.Attr
	// base is slog's handler without them: slow adds them, for what the
	// fast path does not format.
	base slog.Handler
}

func (h *textHandler) slow() slog.Handler {
	if len(h.attrs) == 0 {
		return h.base
	}
	return h.base.WithAttrs(h.attrs)
}

func newTextHandler(w io.Writer, opts *slog.HandlerOptions) slog.Handler {
	if opts.ReplaceAttr != nil || opts.AddSource {
		return slog.NewTextHandler(w, opts)
	}
	level := opts.Level
	if level == nil {
		level = slog.LevelInfo
	}
	return &textHandler{w: w, level: level, base: slog.NewTextHandler(w, opts)}
}

func (h *textHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

var textBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func (h *textHandler) Handle(ctx context.Context, r slog.Record) error {
	bp := textBufs.Get().(*[]byte)
	defer textBufs.Put(bp)
	b := (*bp)[:0]
	if !r.Time.IsZero() {
		b = append(b, "time="...)
		b = appendRFC3339Millis(b, r.Time.Round(0))
		b = append(b, ' ')
	}
	b = append(b, "level="...)
	b = append(b, r.Level.String()...)
	b = append(b, " msg="...)
	b = appendTextString(b, r.Message)
	b = append(b, h.pre...)
	ok := true
	r.Attrs(func(a slog.Attr) bool {
		b, ok = appendTextAttr(b, a)
		return ok
	})
	*bp = b
	if !ok {
		return h.slow().Handle(ctx, r)
	}
	b = append(b, '\n')
	*bp = b
	_, err := h.w.Write(b)
	return err
}

func (h *textHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h2 := &textHandler{w: h.w, level: h.level, base: h.base,
		attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], as...)}
	pre := append([]byte(nil), h.pre...)
	for _, a := range as {
		var ok bool
		if pre, ok = appendTextAttr(pre, a); !ok {
			return h2.slow()
		}
	}
	h2.pre = pre
	return h2
}

// WithGroup returns slog's handler: keys in groups are not on the fast
// path.
func (h *textHandler) WithGroup(name string) slog.Handler {
	return h.slow().WithGroup(name)
}

// appendTextAttr appends " key=value" as slog.TextHandler would, or
// returns false for an attribute outside the fast path: an empty key, a
// group, or a value of another kind than string, integer, bool, duration,
// float, nil, or an error that formats as its Error().
func appendTextAttr(b []byte, a slog.Attr) ([]byte, bool) {
	if a.Key == "" {
		return b, false
	}
	v := a.Value.Resolve()
	n := len(b)
	b = append(b, ' ')
	b = appendTextString(b, a.Key)
	b = append(b, '=')
	switch v.Kind() {
	case slog.KindString:
		return appendTextString(b, v.String()), true
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10), true
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10), true
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool()), true
	case slog.KindDuration:
		return append(b, v.Duration().String()...), true
	case slog.KindFloat64:
		return strconv.AppendFloat(b, v.Float64(), 'g', -1, 64), true
	case slog.KindAny:
		switch x := v.Any().(type) {
		case nil:
			return append(b, "<nil>"...), true
		case fmt.Formatter, encoding.TextMarshaler:
		case error:
			if msg, ok := errorText(x); ok {
				return appendTextString(b, msg), true
			}
		}
	}
	return b[:n], false
}

// errorText returns err.Error(), or false if it panics (a nil pointer
// receiver, say), which fmt, and so slog, prints in a form of its own.
func errorText(err error) (msg string, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return err.Error(), true
}

// appendTextString appends s, quoted if slog.TextHandler would quote it.
func appendTextString(b []byte, s string) []byte {
	if textNeedsQuoting(s) {
		return strconv.AppendQuote(b, s)
	}
	return append(b, s...)
}

// textNeedsQuoting is slog's rule: empty, or holding a space, '=', '"', an
// ASCII control character, or a rune that is invalid, a space or not
// printable.
func textNeedsQuoting(s string) bool {
	if s == "" {
		return true
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if quotedASCII[c] {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
		i += size
	}
	return false
}

var quotedASCII = func() (q [utf8.RuneSelf]bool) {
	for c := range q {
		q[c] = c < 0x20 || c == ' ' || c == '=' || c == '"'
	}
	return q
}()

// appendRFC3339Millis is slog's time format: RFC 3339 with exactly three
// fractional digits.
func appendRFC3339Millis(b []byte, t time.Time) []byte {
	const prefixLen = len("2006-01-02T15:04:05.000")
	n := len(b)
	t = t.Truncate(time.Millisecond).Add(time.Millisecond / 10)
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b[:n+prefixLen], b[n+prefixLen+1:]...)
}
