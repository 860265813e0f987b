package mime

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the parser's output")

// TestGolden parses every testdata/*.eml and compares its renderings,
// SORT keys and part table with testdata/*.golden. The first goldens were
// checked by hand against the grammar of RFC 3501 section 9 and the
// messages' octets; -update rewrites them, to be reviewed in the diff.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.eml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".eml")
		t.Run(name, func(t *testing.T) {
			msg, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Parse(bytes.NewReader(msg))
			if err != nil {
				t.Fatal(err)
			}
			checkSummary(t, msg, s)
			got := describe(msg, s)
			golden := strings.TrimSuffix(file, ".eml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs (run with -update and review the diff):\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}

// checkSummary checks the invariants every summary has: offsets nest and
// lie within the message, the encoding round-trips, and the result does
// not depend on how the message was split into writes.
func checkSummary(t *testing.T, msg []byte, s *Summary) {
	t.Helper()
	if s.Size != int64(len(msg)) || s.Root == nil || s.Root.HeaderStart != 0 || s.Root.End != s.Size {
		t.Fatalf("size %d of %d, root %+v", s.Size, len(msg), s.Root)
	}
	checkPart(t, s.Root, 0, s.Size)
	enc, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	dec, err := Unmarshal(enc)
	if err != nil {
		t.Fatalf("Unmarshal of MarshalBinary: %v", err)
	}
	if !reflect.DeepEqual(dec, s) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", dec, s)
	}
	p := NewParser()
	if _, err := iotestCopy(p, msg); err != nil {
		t.Fatal(err)
	}
	if one := p.Summary(); !reflect.DeepEqual(one, s) {
		t.Fatalf("parsing in 1-octet writes differs:\n got %+v\nwant %+v", one, s)
	}
}

func iotestCopy(p *Parser, msg []byte) (int64, error) {
	r := iotest.OneByteReader(bytes.NewReader(msg))
	var n int64
	buf := make([]byte, 1)
	for {
		k, err := r.Read(buf)
		if k > 0 {
			p.Write(buf[:k])
			n += int64(k)
		}
		if err != nil {
			return n, nil
		}
	}
}

func checkPart(t *testing.T, p *Part, lo, hi int64) {
	t.Helper()
	if !(lo <= p.HeaderStart && p.HeaderStart <= p.BodyStart && p.BodyStart <= p.End && p.End <= hi) {
		t.Fatalf("part offsets %d %d %d outside [%d, %d]", p.HeaderStart, p.BodyStart, p.End, lo, hi)
	}
	if p.Lines < 0 || p.Lines > p.End-p.BodyStart {
		t.Fatalf("part has %d lines in %d octets", p.Lines, p.End-p.BodyStart)
	}
	next := p.BodyStart
	for _, c := range p.Children {
		checkPart(t, c, next, p.End)
		next = c.End
	}
	if p.Message != nil {
		if p.Message.HeaderStart != p.BodyStart {
			t.Fatalf("encapsulated message starts at %d, body at %d", p.Message.HeaderStart, p.BodyStart)
		}
		checkPart(t, p.Message, p.BodyStart, p.End)
	}
}

// describe renders everything a summary offers, one item per line; strings
// with line breaks (IMAP literals) are Go-quoted.
func describe(msg []byte, s *Summary) string {
	var b strings.Builder
	line := func(key, v string) {
		if strings.ContainsAny(v, "\r\n") {
			v = strconv.Quote(v)
		}
		fmt.Fprintf(&b, "%s %s\n", key, v)
	}
	line("ENVELOPE", string(s.AppendEnvelope(nil)))
	line("BODY", string(s.AppendBodyStructure(nil, false)))
	line("BODYSTRUCTURE", string(s.AppendBodyStructure(nil, true)))
	line("ANOMALIES", s.Anomalies.String())
	if s.HasDate {
		line("DATE", time.Unix(s.Date, 0).In(time.FixedZone("", int(s.DateZone)*60)).Format(time.RFC3339))
	} else {
		line("DATE", "none")
	}
	line("BASESUBJECT", fmt.Sprintf("%q reply-or-forward=%v", s.BaseSubject, s.IsReplyOrForward))
	for _, f := range []struct {
		name string
		f    AddressField
	}{{"FROM", From}, {"TO", To}, {"CC", Cc}} {
		line("SORT-"+f.name, fmt.Sprintf("mailbox=%q display=%q", s.SortMailbox(f.f), s.SortDisplay(f.f)))
	}
	line("MESSAGE-ID", fmt.Sprintf("%q", s.MessageID()))
	line("THREAD-PARENTS", fmt.Sprintf("%q", s.ThreadParents()))
	var walk func(path []int)
	walk = func(path []int) {
		for i := 1; ; i++ {
			sub := append(append([]int(nil), path...), i)
			pi, ok := s.Part(sub)
			if !ok {
				return
			}
			describePart(&b, msg, sub, pi)
			walk(sub)
		}
	}
	pi, _ := s.Part(nil)
	describePart(&b, msg, nil, pi)
	walk(nil)
	enc, _ := s.MarshalBinary()
	line("ENCODED-SIZE", strconv.Itoa(len(enc)))
	return b.String()
}

func describePart(b *strings.Builder, msg []byte, path []int, pi PartInfo) {
	var ps []string
	for _, n := range path {
		ps = append(ps, strconv.Itoa(n))
	}
	name := strings.Join(ps, ".")
	if name == "" {
		name = "[]"
	}
	snip := func(r Range) string {
		v := msg[r.Start:r.End]
		if len(v) > 40 {
			return strconv.Quote(string(v[:20])) + "..." + strconv.Quote(string(v[len(v)-16:]))
		}
		return strconv.Quote(string(v))
	}
	fmt.Fprintf(b, "PART %s %s/%s lines=%d MIME=%d-%d BODY=%d-%d %s\n", name, pi.Part.Type, pi.Part.Subtype,
		pi.Part.Lines, pi.MIME.Start, pi.MIME.End, pi.Body.Start, pi.Body.End, snip(pi.Body))
	if pi.IsMessage {
		fmt.Fprintf(b, "PART %s HEADER=%d-%d TEXT=%d-%d %s\n", name, pi.Header.Start, pi.Header.End,
			pi.Text.Start, pi.Text.End, snip(pi.Text))
	}
}
