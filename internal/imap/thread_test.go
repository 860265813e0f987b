package imap

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"quill/internal/mailbox"
)

// item builds a sortItem for message seq with a sent date, base subject,
// reply marker, id and parent ids.
func item(seq uint32, sent int64, subject string, reply bool, id string, parents ...string) sortItem {
	return sortItem{m: mailbox.Message{Seq: seq, UID: seq}, sent: sent, subject: subject,
		isReplyOrForward: reply, msgID: id, parents: parents}
}

func render(roots []*threadNode) string {
	var b []byte
	for _, r := range roots {
		b = appendThread(b, r, false)
	}
	return string(b)
}

// TestThreadReferences covers the cases of RFC 5256 section 3 that the
// golden transcript does not: reference loops, a message that names
// itself, a truncated References field corrected by the message itself,
// and subject grouping of two non-replies and of two dummies.
func TestThreadReferences(t *testing.T) {
	for _, tc := range []struct {
		name  string
		items []sortItem
		want  string
	}{
		{"loop", []sortItem{
			item(1, 1, "a", false, "<1>", "<2>"),
			item(2, 2, "b", false, "<2>", "<1>"),
		}, "(2 1)"},
		{"self", []sortItem{item(1, 1, "a", false, "<1>", "<1>")}, "(1)"},
		{"truncated", []sortItem{
			item(1, 1, "a", false, "<1>"),
			item(3, 3, "a", true, "<3>", "<2>"),         // <2> not known yet: dummy parent
			item(2, 2, "a", true, "<2>", "<1>"),         // now <2> is under <1>
			item(4, 4, "x", false, "<4>", "<1>", "<3>"), // <3> already has a parent
		}, "(1 2 3 4)"},
		{"siblings by subject", []sortItem{
			item(1, 2, "s", false, "<1>"),
			item(2, 1, "s", false, "<2>"),
			item(3, 3, "t", false, "<3>"),
		}, "((2)(1))(3)"},
		{"reply joins original", []sortItem{
			item(1, 2, "s", true, "<1>"),
			item(2, 1, "s", false, "<2>"),
		}, "(2 1)"},
		{"dummies merged", []sortItem{
			item(1, 1, "s", false, "<1>", "<x>"),
			item(2, 2, "s", true, "<2>", "<x>"),
			item(3, 3, "s", true, "<3>", "<y>"),
			item(4, 4, "s", true, "<4>", "<y>"),
		}, "((1)(2)(3)(4))"},
		{"duplicate id", []sortItem{
			item(1, 1, "a", false, "<1>"),
			item(2, 2, "b", false, "<1>"),
			item(3, 3, "c", false, "<3>", "<1>"),
		}, "(1 3)(2)"},
		{"empty subjects not grouped", []sortItem{
			item(1, 1, "", false, ""),
			item(2, 2, "", false, ""),
		}, "(1)(2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := render(threadReferences(tc.items)); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

var numberRE = regexp.MustCompile(`[0-9]+`)

// checkThreads verifies that a rendering names every message exactly once
// and that its parentheses balance with no empty thread-list.
func checkThreads(t *testing.T, out string, n int) {
	t.Helper()
	depth := 0
	for i, c := range out {
		switch c {
		case '(':
			depth++
			if i+1 < len(out) && out[i+1] == ')' {
				t.Fatalf("empty thread-list in %s", out)
			}
		case ')':
			depth--
			if depth < 0 {
				t.Fatalf("unbalanced %s", out)
			}
		}
	}
	if depth != 0 {
		t.Fatalf("unbalanced %s", out)
	}
	var seen []int
	for _, m := range numberRE.FindAllString(out, -1) {
		v, _ := strconv.Atoi(m)
		seen = append(seen, v)
	}
	slices.Sort(seen)
	if len(seen) != n {
		t.Fatalf("%d messages in %s, want %d", len(seen), out, n)
	}
	for i, v := range seen {
		if v != i+1 {
			t.Fatalf("message %d missing or repeated in %s", i+1, out)
		}
	}
}

// FuzzThread builds threads from arbitrary id graphs: each group of four
// octets is one message (its id, two references, subject and reply
// marker drawn from a small alphabet, so that loops, duplicates and
// shared subjects are common). Both algorithms must name every message
// once, in well-formed thread-lists.
func FuzzThread(f *testing.F) {
	f.Add([]byte{1, 2, 3, 0, 2, 1, 3, 1, 3, 3, 3, 2})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{5, 4, 3, 2, 4, 5, 3, 2, 3, 4, 5, 6, 2, 2, 2, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		var items []sortItem
		for i := 0; i+4 <= len(in) && len(items) < 200; i += 4 {
			id := ""
			if in[i]%8 != 0 {
				id = fmt.Sprintf("<%d>", in[i]%8)
			}
			var parents []string
			for _, r := range in[i+1 : i+3] {
				if r%8 != 0 {
					parents = append(parents, fmt.Sprintf("<%d>", r%8))
				}
			}
			seq := uint32(len(items) + 1)
			items = append(items, item(seq, int64(in[i+3]%5), string('a'+rune(in[i+3]%3)), in[i+3]&8 != 0, id, parents...))
		}
		checkThreads(t, render(threadReferences(slices.Clone(items))), len(items))
		checkThreads(t, render(threadOrderedSubject(items)), len(items))
	})
}
