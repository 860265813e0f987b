package mime

import (
	"bytes"
	"fmt"
	"net/mail"
	"testing"
)

func multipartMessage(size int) []byte {
	var b bytes.Buffer
	b.WriteString("From: Alice <alice@example.org>\r\nTo: bob@example.net\r\nSubject: photos\r\n" +
		"Date: Tue, 1 Jul 2025 09:00:00 +0200\r\nMessage-ID: <p@example.org>\r\nMIME-Version: 1.0\r\n" +
		"Content-Type: multipart/mixed; boundary=\"=_b\"\r\n\r\n--=_b\r\nContent-Type: multipart/alternative; boundary=\"=_a\"\r\n\r\n" +
		"--=_a\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nSee attached.\r\n--=_a\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<p>See attached.</p>\r\n--=_a--\r\n")
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "--=_b\r\nContent-Type: image/jpeg; name=\"p%d.jpg\"\r\nContent-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=\"p%d.jpg\"\r\n\r\n", i, i)
		for j := 0; j < 2000 && b.Len() < size; j++ {
			b.WriteString("/9j/4AAQSkZJRgABAQEASABIAAD/2wBDAAMCAgMCAgMDAwMEAwMEBQgFBQQEBQoHBwYIDAoMDAsKCwsNDhIQDQ4RDgsLEBYQERMUFRUV\r\n")
		}
	}
	b.WriteString("--=_b--\r\n")
	return b.Bytes()
}

func BenchmarkParse(b *testing.B) {
	for _, bc := range []struct {
		name string
		msg  []byte
	}{
		{"text-5KB", textMessage(5 << 10)},
		{"multipart-1MB", multipartMessage(1 << 20)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.msg)))
			b.ReportAllocs()
			for b.Loop() {
				p := NewParser()
				// 32 KiB writes, as io.Copy and PutBlob's chunking give.
				for m := bc.msg; len(m) > 0; {
					n := min(len(m), 32<<10)
					p.Write(m[:n])
					m = m[n:]
				}
				p.Summary()
			}
		})
	}
}

func BenchmarkAppendBodyStructure(b *testing.B) {
	s, _ := Parse(bytes.NewReader(multipartMessage(64 << 10)))
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = s.AppendBodyStructure(buf[:0], true)
	}
}

func BenchmarkAppendEnvelope(b *testing.B) {
	s, _ := Parse(bytes.NewReader(textMessage(5 << 10)))
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = s.AppendEnvelope(buf[:0])
	}
}

func BenchmarkUnmarshal(b *testing.B) {
	s, _ := Parse(bytes.NewReader(textMessage(5 << 10)))
	enc, _ := s.MarshalBinary()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Unmarshal(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseDate compares mail.ParseDate with parseDate on the
// time.RFC1123Z form most mail carries.
func BenchmarkParseDate(b *testing.B) {
	const date = "Tue, 01 Jul 2025 09:00:00 +0530"
	b.Run("mail.ParseDate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := mail.ParseDate(date); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parseDate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := parseDate(date); !ok {
				b.Fatal("not parsed")
			}
		}
	})
}
