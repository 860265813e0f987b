package imap

import (
	"context"
	"errors"
	"io"
	"strings"

	"github.com/klauspost/compress/flate"

	"quill/internal/textconn"
)

// cmdCompress: RFC 4978. Raw deflate (RFC 1951) in both directions from the
// octet after the tagged OK, above TLS; textconn.Conn.Flush ends each
// response burst with a sync flush (section 4), so the client never waits
// on a half-filled block. The compressor uses flate.BestSpeed: a server
// pays the CPU for every connection, and mail text compresses well at any
// level. The inflater needs no separate bound: every read above it is
// bounded by the line and literal limits.
//
// The inflater is klauspost/compress's with WithPartialBlock, not the
// standard library's: clients such as mbsync end each command with
// zlib's Z_PARTIAL_FLUSH (an empty fixed-Huffman block, not byte-aligned),
// and compress/flate returns data only at a stored block or a full window,
// so it would wait forever for the rest of a command already received
// (golang/go#31514).
func (s *session) cmdCompress(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	alg, err := d.atom("")
	if err != nil {
		return "", err
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if s.compressed {
		return "", &protoError{no: true, code: "COMPRESSIONACTIVE", text: "compression already active"}
	}
	if !strings.EqualFold(alg, "DEFLATE") {
		return "", syntaxErr("unknown compression mechanism")
	}
	// Section 3: the client may send no command until it has the OK; what
	// it did send was written before compression and cannot be honoured.
	if s.conn.Buffered() > 0 {
		return "", syntaxErr("command pipelined after COMPRESS")
	}
	s.enc.raw(c.tag).raw(" OK DEFLATE active").crlf()
	err = s.conn.Wrap(func(rw io.ReadWriter) io.ReadWriter {
		// flate.NewWriter fails only for an invalid level.
		w, _ := flate.NewWriter(rw, flate.BestSpeed)
		return &deflateStream{r: flate.NewReaderOpts(rw, flate.WithPartialBlock()), w: w}
	})
	if err != nil {
		if errors.Is(err, textconn.ErrPipelined) {
			// Not reached: Buffered was checked above, on this goroutine.
			s.log.Error("imap: COMPRESS raced with input", "err", err)
		}
		return "", errAbort
	}
	s.compressed = true
	return "", errHandled
}

// deflateStream is the COMPRESS=DEFLATE layer under the connection's
// buffers. Read and Write may be used by two goroutines at once (IDLE).
type deflateStream struct {
	r io.ReadCloser
	w *flate.Writer
}

func (z *deflateStream) Read(p []byte) (int, error)  { return z.r.Read(p) }
func (z *deflateStream) Write(p []byte) (int, error) { return z.w.Write(p) }

// Flush is called by textconn.Conn.Flush after each response burst.
func (z *deflateStream) Flush() error { return z.w.Flush() }
