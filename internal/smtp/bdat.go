package smtp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// bdat runs BDAT (RFC 3030). The message streams to the Backend while the
// chunks arrive: between chunks the body reader acknowledges the chunk and
// reads the next command itself. Any command but BDAT or NOOP there ends
// the transaction without delivery and is then run as usual. A refused
// chunk is still read and discarded, so the session stays in sync with a
// client that pipelined it.
func (s *session) bdat(arg string) error {
	size, last, ok, err := parseBDAT(arg)
	if !ok {
		// Without a size the next command cannot be found.
		s.closing = true
		s.tx = nil
		return err
	}
	if err == nil {
		err = s.dataReady()
	}
	if err == nil && size > s.lim.maxMessage {
		err = errMessageTooBig
	}
	prev := s.conn.ReadTimeout()
	s.conn.SetReadTimeout(s.lim.dataTimeout)
	defer s.conn.SetReadTimeout(prev)
	// One transfer spans every chunk and the BDAT commands between them.
	s.conn.BeginTransfer(s.lim.minRate, s.lim.transferGrace)
	defer s.conn.EndTransfer()
	if err != nil {
		s.tx = nil
		if _, derr := io.CopyN(io.Discard, s.conn.Reader(), size); derr != nil {
			s.closing = true
			return nil
		}
		return err
	}

	st := &bdatStream{s: s, br: s.conn.Reader(), chunk: size, remaining: size, last: last, total: size}
	results, err := s.deliver(newCRLFNormalizer(st), func() bool { return st.eofSeen })
	if st.ioErr == nil {
		if _, derr := io.CopyN(io.Discard, st.br, st.remaining); derr != nil {
			st.ioErr = derr
		}
	}
	if st.ioErr != nil {
		s.bodyFailed("BDAT", st.ioErr)
		return nil
	}
	if errors.Is(err, errBDATAborted) {
		// Every chunk so far has had its 250; the interrupting command
		// (in pendingLine) gets the next reply.
		s.tx = nil
		return nil
	}
	s.finish(results, err)
	return nil
}

// bdatStream is the body of a chunked message: the octets of consecutive
// BDAT chunks, read as the client sends them.
type bdatStream struct {
	s         *session
	br        *bufio.Reader
	chunk     int64 // size of the current chunk
	remaining int64 // octets of the current chunk not yet read
	last      bool  // the current chunk is the last
	total     int64 // octets announced so far
	eofSeen   bool
	ioErr     error // connection failure
	err       error // sticky error for Read
}

func (b *bdatStream) Read(p []byte) (int, error) {
	for b.remaining == 0 {
		if b.err != nil {
			return 0, b.err
		}
		if b.last {
			b.eofSeen = true
			return 0, io.EOF
		}
		b.err = b.nextChunk()
	}
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.br.Read(p[:min(int64(len(p)), b.remaining)])
	b.remaining -= int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		b.ioErr, b.err = err, err
		return n, err
	}
	return n, nil
}

// nextChunk acknowledges the finished chunk and reads the command after it.
func (b *bdatStream) nextChunk() error {
	s := b.s
	s.writeReply(reply{250, "2.0.0", fmt.Sprintf("%d octets received", b.chunk)})
	for {
		line, err := s.nextLine()
		if err != nil {
			b.ioErr = err
			return err
		}
		cmd, perr := parseCommand(line)
		if perr == nil && cmd.verb == "NOOP" {
			s.srv.Metrics.Command("NOOP")
			s.writeReply(reply{250, "2.0.0", "OK"})
			continue
		}
		if perr == nil && cmd.verb == "BDAT" {
			size, last, ok, err := parseBDAT(cmd.arg)
			if ok && err == nil {
				s.srv.Metrics.Command("BDAT")
				b.chunk, b.remaining, b.last = size, size, last
				b.total += size
				if b.total > s.lim.maxMessage {
					return errMessageTooBig
				}
				return nil
			}
		}
		// Anything else, a malformed BDAT included, ends the transaction
		// and is run as an ordinary command.
		s.pendingLine = []byte(line)
		return errBDATAborted
	}
}
