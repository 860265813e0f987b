package loadgen

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestReadReply(t *testing.T) {
	for _, tc := range []struct {
		in    string
		code  int
		lines []string
		bad   bool
	}{
		{in: "250 ok\r\n", code: 250, lines: []string{"ok"}},
		{in: "250\r\n", code: 250, lines: []string{""}},
		{in: "250-a\r\n250-b\r\n250 c\r\n", code: 250, lines: []string{"a", "b", "c"}},
		{in: "250-a\n250 c\n", code: 250, lines: []string{"a", "c"}},
		{in: "250-a\r\n251 c\r\n", bad: true},
		{in: "25 ok\r\n", bad: true},
		{in: "2x0 ok\r\n", bad: true},
		{in: "199 ok\r\n", bad: true},
		{in: "250_ok\r\n", bad: true},
		{in: "250-" + strings.Repeat("x", maxReplyLine) + "\r\n250 ok\r\n", bad: true},
		{in: strings.Repeat("250-x\r\n", maxReplyLines) + "250 x\r\n", bad: true},
		{in: "250-unterminated", bad: true},
	} {
		var lines []string
		code, _, err := readReply(bufio.NewReaderSize(strings.NewReader(tc.in), 4096), &lines)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: accepted", tc.in)
			}
			continue
		}
		if err != nil || code != tc.code || strings.Join(lines, "|") != strings.Join(tc.lines, "|") {
			t.Errorf("%q: got %d %q %v", tc.in, code, lines, err)
		}
	}
}

func FuzzParseReplyLine(f *testing.F) {
	for _, s := range []string{"250 ok", "250-PIPELINING", "354", "421 4.3.2 bye", "2", "999 x", "250\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		code, more, text, err := parseReplyLine(line)
		if err != nil {
			return
		}
		if code < 200 || code > 599 || len(text) > len(line) {
			t.Fatalf("%q: code %d text %q", line, code, text)
		}
		if more && line[3] != '-' {
			t.Fatalf("%q: more without '-'", line)
		}
	})
}

func TestStripTraceAndHeaderValue(t *testing.T) {
	msg := "Return-Path: <a@b>\r\nReceived: from x\r\n\tby y;\r\n date\r\nreceived: again\r\n" +
		"From: a@b\r\nReceived: not leading\r\nX-Quill-Load-Id:  run.7 \r\n\r\nX-Quill-Load-Id: body\r\n"
	got := string(StripTrace([]byte(msg)))
	if !strings.HasPrefix(got, "From: a@b\r\nReceived: not leading\r\n") {
		t.Fatalf("StripTrace: %q", got)
	}
	if v, ok := HeaderValue([]byte(got), "x-quill-load-id"); !ok || v != "run.7" {
		t.Fatalf("HeaderValue: %q %v", v, ok)
	}
	folded := "Subject: a\r\nX-Quill-Load-Id: run\r\n .8\r\n\r\n"
	if v, ok := HeaderValue([]byte(folded), IDHeader); !ok || v != "run .8" {
		t.Fatalf("folded HeaderValue: %q %v", v, ok)
	}
	if _, ok := HeaderValue([]byte("Subject: a\r\n\r\nX-Quill-Load-Id: x\r\n"), IDHeader); ok {
		t.Fatal("HeaderValue looked into the body")
	}
}

func FuzzStripTrace(f *testing.F) {
	f.Add([]byte("Return-Path: <a@b>\r\nReceived: from x\r\n\tby y\r\nFrom: a\r\n\r\nbody\r\n"))
	f.Add([]byte("Received:\r\n"))
	f.Add([]byte("\r\n"))
	f.Add([]byte("X-Quill-Load-Id: r.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		out := StripTrace(msg)
		if !bytes.HasSuffix(msg, out) {
			t.Fatalf("result is not a suffix of the input")
		}
		if name, ok := fieldName(out); ok && (strings.EqualFold(name, "Received") || strings.EqualFold(name, "Return-Path")) {
			t.Fatalf("a trace field survived: %q", out)
		}
		if v, ok := HeaderValue(msg, IDHeader); ok && strings.Contains(v, "\n") {
			t.Fatalf("HeaderValue kept a line feed: %q", v)
		}
	})
}

func TestReadMultiline(t *testing.T) {
	in := "line1\r\n..dot\r\n.\r\nafter\r\n"
	r := bufio.NewReaderSize(strings.NewReader(in), maxMessageLine+2)
	got, err := readMultiline(r, nil, 1000)
	if err != nil || string(got) != "line1\r\n.dot\r\n" {
		t.Fatalf("%q %v", got, err)
	}
	if _, err := readMultiline(bufio.NewReaderSize(strings.NewReader(in), maxMessageLine+2), nil, 10); err == nil {
		t.Fatal("size limit not enforced")
	}
	if _, err := readMultiline(bufio.NewReaderSize(strings.NewReader("no end\r\n"), maxMessageLine+2), nil, 1000); err == nil {
		t.Fatal("missing terminator accepted")
	}
}

func FuzzReadMultiline(f *testing.F) {
	f.Add([]byte("a\r\n..b\r\n.\r\n"), 100)
	f.Add([]byte(".\r\n"), 0)
	f.Add([]byte("x\n.\n"), 3)
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		max = max & 0xffff
		got, err := readMultiline(bufio.NewReaderSize(bytes.NewReader(in), maxMessageLine+2), nil, max)
		if err != nil {
			return
		}
		if len(got) > max {
			t.Fatalf("%d octets over the %d limit", len(got), max)
		}
		// Re-stuffing what was read must reproduce a valid response.
		var b bytes.Buffer
		w := bufio.NewWriter(&b)
		if err := writeDotStuffed(w, got); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		again, err := readMultiline(bufio.NewReaderSize(&b, maxMessageLine+2), nil, max)
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("round trip: %q -> %q (%v)", got, again, err)
		}
	})
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Millisecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Millisecond}, {0.9, 900 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {1, time.Second}} {
		got := h.quantile(tc.q)
		if got > tc.want || float64(tc.want-got) > 0.01*float64(tc.want) {
			t.Errorf("q%.2f = %v, want within 1%% below %v", tc.q, got, tc.want)
		}
	}
	for _, v := range []uint64{0, 1, 127, 128, 255, 256, 1<<40 + 12345, 1<<64 - 1} {
		i := histBucket(v)
		if histLow(i) > v || (i+1 < len(h.counts) && histLow(i+1) <= v) {
			t.Errorf("value %d in bucket %d [%d, %d)", v, i, histLow(i), histLow(i+1))
		}
	}
	var empty histogram
	if empty.quantile(0.5) != 0 {
		t.Error("empty histogram quantile")
	}
}
