package loadgen

import (
	"bytes"
	"strconv"
	"testing"
	"time"
)

var fixedNow = func() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) }

func testSpec(size int, users []string) Spec {
	return Spec{
		Seed:  42,
		RunID: "test-run",
		From:  "loadgen@quill-load.invalid",
		Sizes: FixedSize(size),
		Rcpts: Uniform{Users: users},
		Now:   fixedNow,
	}
}

func TestGeneratorMessageShape(t *testing.T) {
	users := UserNames("example.test", 3)
	dotLines := 0
	for _, size := range []int{0, 1, 100, 380, 381, 382, 383, 455, 456, 457, 4700, 300 << 10} {
		g, err := NewGenerator(testSpec(size, users))
		if err != nil {
			t.Fatal(err)
		}
		for seq := uint64(0); seq < 20; seq++ {
			m := g.Next(seq)
			if m.Seq != seq || len(m.Rcpts) != 1 {
				t.Fatalf("seq %d: got seq %d rcpts %v", seq, m.Seq, m.Rcpts)
			}
			header, _, ok := bytes.Cut(m.Data, []byte("\r\n\r\n"))
			if !ok {
				t.Fatalf("size %d: no end of header section", size)
			}
			h := len(header) + 4
			want := max(size, h)
			if size-h == 1 {
				want = size + 1 // a one-octet body cannot end in CRLF
			}
			if len(m.Data) != want {
				t.Errorf("size %d: generated %d octets, want %d", size, len(m.Data), want)
			}
			if id, ok := HeaderValue(m.Data, IDHeader); !ok || id != m.ID() || id != "test-run."+itoa(seq) {
				t.Fatalf("id header %q, %v; ID() %q", id, ok, m.ID())
			}
			if !bytes.HasSuffix(m.Data, []byte("\r\n")) {
				t.Fatalf("size %d: does not end in CRLF", size)
			}
			for _, line := range bytes.Split(m.Data[:len(m.Data)-2], []byte("\r\n")) {
				if len(line) > 78 {
					t.Fatalf("size %d: line of %d octets", size, len(line))
				}
				if bytes.ContainsAny(line, "\r\n\x00") {
					t.Fatalf("size %d: bare CR or LF or NUL in %q", size, line)
				}
				if len(line) > 0 && line[0] == '.' {
					dotLines++
				}
			}
		}
	}
	if dotLines == 0 {
		t.Error("no body line starts with '.'; dot-stuffing is never exercised")
	}
}

func itoa(u uint64) string { return strconv.FormatUint(u, 10) }

// TestGeneratorReproducible: a message is a function of (seed, seq) alone,
// whichever generator makes it and in whatever order.
func TestGeneratorReproducible(t *testing.T) {
	users := UserNames("example.test", 100)
	g1, _ := NewGenerator(testSpec(4700, users))
	g2, _ := NewGenerator(testSpec(4700, users))
	sums := map[[32]byte]uint64{}
	for seq := uint64(0); seq < 50; seq++ {
		a := g1.Next(seq)
		sum, rc := a.Sum(), a.Rcpts[0]
		g2.Next(seq + 1000) // interleave unrelated work on g2
		b := g2.Next(seq)
		if b.Sum() != sum || b.Rcpts[0] != rc {
			t.Fatalf("seq %d differs between generators", seq)
		}
		if prev, dup := sums[sum]; dup {
			t.Fatalf("seq %d and %d have the same content", prev, seq)
		}
		sums[sum] = seq
	}
	other := testSpec(4700, users)
	other.Seed = 43
	g3, _ := NewGenerator(other)
	if g3.Next(0).Sum() == g1.Next(0).Sum() {
		t.Fatal("different seeds gave the same message")
	}
}

func TestSpecValidate(t *testing.T) {
	good := testSpec(100, []string{"a@b"})
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Spec){
		"empty run id": func(s *Spec) { s.RunID = "" },
		"dot in id":    func(s *Spec) { s.RunID = "a.b" },
		"no from":      func(s *Spec) { s.From = "" },
		"no sizes":     func(s *Spec) { s.Sizes = nil },
		"no rcpts":     func(s *Spec) { s.Rcpts = nil },
	} {
		s := good
		mut(&s)
		if err := s.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func BenchmarkGeneratorOverhead(b *testing.B) {
	for _, size := range []int{4700, 300 << 10} {
		b.Run(itoa(uint64(size)), func(b *testing.B) {
			g, err := NewGenerator(testSpec(size, UserNames("example.test", 1000)))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			var seq uint64
			for b.Loop() {
				g.Next(seq)
				seq++
			}
		})
	}
}
