package imap

import (
	"bytes"
	"encoding/base64"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"quill/internal/mime"
)

// refContains is the in-memory definition bodyMatcher.stream must agree
// with: the lowered text contains the lowered needle.
func refContains(text, needle []byte) bool {
	return bytes.Contains(appendLower(nil, text), appendLower(nil, needle))
}

// chunkedReader returns at most the next size in sizes octets per Read,
// cycling through sizes, so reads split runes and needles anywhere.
type chunkedReader struct {
	b     []byte
	sizes []byte
	i     int
}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := len(p)
	if len(r.sizes) > 0 {
		n = min(n, int(r.sizes[r.i%len(r.sizes)])%7+1)
		r.i++
	}
	n = copy(p, r.b[:min(n, len(r.b))])
	r.b = r.b[n:]
	return n, nil
}

func TestBodyMatcherChunkBoundaries(t *testing.T) {
	pad := strings.Repeat("x", searchChunk-3)
	for _, tc := range []struct {
		name, text, needle string
		want               bool
	}{
		{"spans chunks", pad + "Needle here", "NEEDLE", true},
		{"rune split by chunk", strings.Repeat("x", searchChunk-1) + "Ünïcode", "üNÏ", true},
		{"ends at chunk", strings.Repeat("x", searchChunk-6) + "needle", "needle", true},
		{"second chunk only", strings.Repeat("x", 2*searchChunk) + "ÉTÉ", "été", true},
		{"absent", pad + "needl", "needle", false},
		{"partial prefix at boundary", pad + "nee" + pad + "dle", "needle", false},
		{"invalid octets", "caf\xe9 \xe2\x82", "caf\xef\xbf\xbd \xef\xbf\xbd", true},
	} {
		for _, r := range []struct {
			name string
			r    io.Reader
		}{
			{"whole", strings.NewReader(tc.text)},
			{"one byte", iotest.OneByteReader(strings.NewReader(tc.text))},
			{"data with EOF", iotest.DataErrReader(strings.NewReader(tc.text))},
		} {
			got, err := newBodyMatcher(tc.needle).stream(r.r)
			if err != nil || got != tc.want {
				t.Errorf("%s/%s: stream = %v, %v; want %v", tc.name, r.name, got, err, tc.want)
			}
			if ref := refContains([]byte(tc.text), []byte(tc.needle)); ref != tc.want {
				t.Errorf("%s: reference = %v, want %v", tc.name, ref, tc.want)
			}
		}
	}
}

func TestBodyMatcherReadError(t *testing.T) {
	boom := iotest.ErrReader(io.ErrUnexpectedEOF)
	if _, err := newBodyMatcher("x").stream(boom); err == nil {
		t.Error("stream hid a read error")
	}
	if _, err := newBodyMatcher("x").validUTF8(boom); err == nil {
		t.Error("validUTF8 hid a read error")
	}
}

// TestBodyMatcherReuse checks that a matcher keeps no state between parts:
// a needle split across two parts does not match.
func TestBodyMatcherReuse(t *testing.T) {
	bm := newBodyMatcher("needle")
	if ok, _ := bm.stream(strings.NewReader("a nee")); ok {
		t.Fatal("matched the first half")
	}
	if ok, _ := bm.stream(strings.NewReader("dle b")); ok {
		t.Error("a match spanned two parts")
	}
	if ok, _ := bm.stream(strings.NewReader("the NEEDLE")); !ok {
		t.Error("no match after reuse")
	}
}

func TestBodyMatcherMessage(t *testing.T) {
	msg := "Content-Type: multipart/alternative; boundary=x\r\n\r\n" +
		"--x\r\nContent-Type: text/html; charset=windows-1252\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n" +
		"<p>=93Quoted=94 na=EFve</p>\r\n" +
		"--x\r\nContent-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n\r\n" +
		"c2VjcmV0\r\n" +
		"--x\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n" +
		"8-bit caf\xc3\xa9 labelled us-ascii\r\n" +
		"--x--\r\n"
	sum, err := mime.Parse(strings.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	body := strings.NewReader(msg)
	for needle, want := range map[string]bool{
		"“quoted”":        true, // windows-1252 through the WHATWG index
		"NAÏVE":           true,
		"secret":          false, // the decoded PDF is not text
		"c2VjcmV0":        false, // nor is its encoded form
		"CAFÉ":            true,  // us-ascii holding valid UTF-8
		"multipart":       false, // the header is not the body
		"labelled us-asc": true,
	} {
		got, err := newBodyMatcher(needle).message(body, sum.Root, false)
		if err != nil || got != want {
			t.Errorf("%q: message = %v, %v; want %v", needle, got, err, want)
		}
	}
}

func TestHeaderTextMatch(t *testing.T) {
	hdr := []byte("From: =?ISO-8859-1?Q?Ren=E9?= <rene@example.org>\r\nSubject: a\r\n  folded =?UTF-8?B?w6l0w6k=?=\r\n\r\nBody: not header\r\n")
	for needle, want := range map[string]bool{
		"from: rené":    true,
		"a folded été":  false, // unfolding keeps the white space
		"a  folded été": true,
		"body: not":     false,
		"SUBJECT":       true,
	} {
		if got := headerTextMatch(hdr, appendLower(nil, []byte(needle))); got != want {
			t.Errorf("%q: headerTextMatch = %v, want %v", needle, got, want)
		}
	}
}

// FuzzBodyMatcher checks that streaming with arbitrary read sizes agrees
// with matching the whole text at once.
func FuzzBodyMatcher(f *testing.F) {
	f.Add([]byte("Grüße aus Köln"), []byte("KÖLN"), []byte{1, 2, 3})
	f.Add([]byte("caf\xe9\xe2\x82\xac"), []byte("€"), []byte{0})
	f.Add([]byte("ǅungla İstanbul ΣΑΣ"), []byte("ǆ"), []byte{5, 1})
	f.Add([]byte(""), []byte("a"), []byte(nil))
	f.Fuzz(func(t *testing.T, text, needle, sizes []byte) {
		if len(needle) == 0 {
			return
		}
		want := refContains(text, needle)
		got, err := newBodyMatcher(string(needle)).stream(&chunkedReader{b: text, sizes: sizes})
		if err != nil || got != want {
			t.Fatalf("stream(%q, %q) = %v, %v; want %v", text, needle, got, err, want)
		}
	})
}

// BenchmarkBodyMatcher measures BODY on a 1 MiB base64 UTF-8 part that
// does not contain the needle (the whole part is decoded and scanned).
func BenchmarkBodyMatcher(b *testing.B) {
	text := strings.Repeat("Grüße aus Köln, das Frühstück ist fertig. ", 1<<20/44)
	var msg bytes.Buffer
	msg.WriteString("Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n")
	enc := base64.NewEncoder(base64.StdEncoding, &msg)
	enc.Write([]byte(text))
	enc.Close()
	sum, err := mime.Parse(bytes.NewReader(msg.Bytes()))
	if err != nil {
		b.Fatal(err)
	}
	body := bytes.NewReader(msg.Bytes())
	bm := newBodyMatcher("absent needle")
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if ok, err := bm.message(body, sum.Root, false); ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}
