package loadgen

import (
	"bufio"
	"slices"
	"strings"
	"testing"
)

// readResponse reads one response from text with the client's reader.
func readResponse(text string) (*IMAPResponse, error) {
	ir := imapReader{r: bufio.NewReaderSize(strings.NewReader(text), maxIMAPLine+2)}
	r, err := ir.read(1 << 20)
	if err != nil {
		return nil, err
	}
	return exported(r), nil
}

func TestParseFetch(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want FetchItems
		ok   bool
		err  bool
	}{
		{in: "* 3 FETCH (UID 7 FLAGS (\\Seen $Hist1) MODSEQ (12) BODY[HEADER.FIELDS (X-QUILL-HISTORY)] {5}\r\nhello)\r\n",
			want: FetchItems{Seq: 3, UID: 7, Flags: []string{`\Seen`, "$Hist1"}, HasFlags: true, ModSeq: 12, Body: []byte("hello"), HasBody: true}, ok: true},
		{in: "* 1 FETCH (BODY[] \"a\\\"b\" UID 2 FLAGS ())\r\n",
			want: FetchItems{Seq: 1, UID: 2, Flags: []string{}, HasFlags: true, Body: []byte(`a"b`), HasBody: true}, ok: true},
		{in: "* 4 FETCH (FLAGS (\\Flagged) ENVELOPE (NIL \"s\" ((NIL NIL \"a\" \"b\")) NIL NIL NIL NIL NIL NIL NIL) UID 9)\r\n",
			want: FetchItems{Seq: 4, UID: 9, Flags: []string{`\Flagged`}, HasFlags: true}, ok: true},
		{in: "* 2 FETCH (UID 5 BODY[]<0> {2}\r\nab BODY[TEXT] {1}\r\nc)\r\n",
			want: FetchItems{Seq: 2, UID: 5, Body: []byte("ab"), HasBody: true}, ok: true},
		{in: "* 3 EXISTS\r\n"},
		{in: "* OK [UIDNEXT 4] x\r\n"},
		{in: "* 0 FETCH (UID 1)\r\n", err: true},
		{in: "* 1 FETCH (UID x)\r\n", err: true},
		{in: "* 1 FETCH (FLAGS \\Seen)\r\n", err: true},
		{in: "* 1 FETCH (UID 1\r\n", err: true},
		{in: "* 1 FETCH UID 1\r\n", err: true},
	} {
		r, err := readResponse(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		got, ok, err := ParseFetch(r)
		if (err != nil) != tc.err || ok != tc.ok {
			t.Errorf("%q: ok %v, err %v; want ok %v, error %v", tc.in, ok, err, tc.ok, tc.err)
			continue
		}
		if !tc.ok {
			continue
		}
		if got.Seq != tc.want.Seq || got.UID != tc.want.UID || got.ModSeq != tc.want.ModSeq || got.HasFlags != tc.want.HasFlags ||
			!slices.Equal(got.Flags, tc.want.Flags) || got.HasBody != tc.want.HasBody || string(got.Body) != string(tc.want.Body) {
			t.Errorf("%q:\n got %+v\nwant %+v", tc.in, got, tc.want)
		}
	}
}

func TestResponseCodeAndUIDSet(t *testing.T) {
	name, args, ok := ResponseCode("[COPYUID 7 1:3,9 10:13] moved")
	if !ok || name != "COPYUID" || !slices.Equal(args, []string{"7", "1:3,9", "10:13"}) {
		t.Fatalf("ResponseCode: %q %q %v", name, args, ok)
	}
	if _, _, ok := ResponseCode("APPEND completed"); ok {
		t.Error("ResponseCode found a code in a text without one")
	}
	src, err := ParseUIDSet(args[1])
	if err != nil || !slices.Equal(src, []uint32{1, 2, 3, 9}) {
		t.Errorf("ParseUIDSet(%q) = %v, %v", args[1], src, err)
	}
	if got, err := ParseUIDSet("5:3"); err != nil || !slices.Equal(got, []uint32{5, 4, 3}) {
		t.Errorf("ParseUIDSet(5:3) = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "1:*", "a", "1,,2", "1:4294967295"} {
		if _, err := ParseUIDSet(bad); err == nil {
			t.Errorf("ParseUIDSet(%q) accepted", bad)
		}
	}
}

func FuzzParseFetch(f *testing.F) {
	for _, s := range []string{
		"* 3 FETCH (UID 7 FLAGS (\\Seen) MODSEQ (12) BODY[HEADER.FIELDS (X-QUILL-HISTORY)] {5}\r\nhello)\r\n",
		"* 1 FETCH (BODY[] \"a\\\"b\" UID 2 FLAGS ())\r\n",
		"* 4 FETCH (ENVELOPE (NIL \"s\" ((NIL NIL \"a\" \"b\")) NIL) UID 9)\r\n",
		"* 2 FETCH (UID 5 BODY[]<0> {2}\r\nab BODY[TEXT] ~{1}\r\nc)\r\n",
		"* 1 FETCH ((((((((((\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := readResponse(s)
		if err != nil {
			return
		}
		it, ok, err := ParseFetch(r)
		if err == nil && ok && it.Seq == 0 {
			t.Fatalf("FETCH parsed with sequence number 0: %q", s)
		}
		_, args, _ := ResponseCode(s)
		for _, a := range args {
			if uids, err := ParseUIDSet(a); err == nil && len(uids) > maxUIDSet {
				t.Fatalf("ParseUIDSet(%q) expanded to %d", a, len(uids))
			}
		}
	})
}
