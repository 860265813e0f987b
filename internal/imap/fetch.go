package imap

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"quill/internal/mailbox"
	"quill/internal/mime"
)

// fetchItem is one fetch-att (RFC 9051 section 9).
type fetchItem struct {
	name string // FLAGS, UID, INTERNALDATE, RFC822.SIZE, ENVELOPE, BODYSTRUCTURE, BODY, RFC822, RFC822.HEADER, RFC822.TEXT, MODSEQ, or BODY[] for sections
	sec  section
	peek bool
	// partial: <offset.count> when count > 0 (RFC 9051 section 6.4.5).
	partial       bool
	offset, count uint32
}

// section is a section-spec: part numbers and a text part.
type section struct {
	path   []int
	text   string   // "", HEADER, HEADER.FIELDS, HEADER.FIELDS.NOT, TEXT, MIME
	fields []string // for HEADER.FIELDS(.NOT), upper case
}

// String renders the section as the response names it.
func (s section) String() string {
	var b strings.Builder
	for i, p := range s.path {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strconv.Itoa(p))
	}
	if s.text != "" {
		if len(s.path) > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.text)
	}
	if s.fields != nil {
		b.WriteString(" (")
		b.WriteString(strings.Join(s.fields, " "))
		b.WriteByte(')')
	}
	return b.String()
}

// parseFetchAtts reads the fetch attributes: a macro, one attribute or a
// parenthesized list.
func parseFetchAtts(d *decoder) ([]fetchItem, error) {
	if d.peek() == '(' {
		var items []fetchItem
		err := d.list(func() error {
			it, err := parseFetchAtt(d)
			items = append(items, it)
			return err
		})
		if len(items) == 0 && err == nil {
			err = syntaxErr("empty fetch attribute list")
		}
		return items, err
	}
	save := d.line
	a, err := d.atom("")
	if err != nil {
		return nil, err
	}
	switch strings.ToUpper(a) {
	case "ALL":
		return []fetchItem{{name: "FLAGS"}, {name: "INTERNALDATE"}, {name: "RFC822.SIZE"}, {name: "ENVELOPE"}}, nil
	case "FAST":
		return []fetchItem{{name: "FLAGS"}, {name: "INTERNALDATE"}, {name: "RFC822.SIZE"}}, nil
	case "FULL":
		return []fetchItem{{name: "FLAGS"}, {name: "INTERNALDATE"}, {name: "RFC822.SIZE"}, {name: "ENVELOPE"}, {name: "BODY"}}, nil
	}
	d.line = save
	it, err := parseFetchAtt(d)
	return []fetchItem{it}, err
}

func parseFetchAtt(d *decoder) (fetchItem, error) {
	// The attribute name runs up to '[', SP or ')'.
	i := 0
	for i < len(d.line) && d.line[i] != '[' && d.line[i] != ' ' && d.line[i] != ')' {
		i++
	}
	name := strings.ToUpper(string(d.line[:i]))
	d.line = d.line[i:]
	it := fetchItem{name: name}
	switch name {
	case "FLAGS", "UID", "INTERNALDATE", "RFC822.SIZE", "ENVELOPE", "BODYSTRUCTURE", "RFC822", "RFC822.HEADER", "RFC822.TEXT", "MODSEQ":
		return it, nil
	case "BINARY", "BINARY.PEEK", "BINARY.SIZE":
		// section-binary: part numbers only (RFC 9051 section 9).
		if err := d.expect('['); err != nil {
			return it, err
		}
		var err error
		for d.peek() >= '1' && d.peek() <= '9' {
			var n uint32
			if n, err = d.number(); err != nil {
				return it, err
			}
			if len(it.sec.path) >= 32 {
				return it, &protoError{code: "LIMIT", text: "section nested too deeply"}
			}
			it.sec.path = append(it.sec.path, int(n))
			if !d.accept('.') {
				break
			}
		}
		if err := d.expect(']'); err != nil {
			return it, err
		}
		it.name, it.peek = "BINARY[]", name == "BINARY.PEEK"
		if name == "BINARY.SIZE" {
			it.name = "BINARY.SIZE[]"
			return it, nil
		}
		return it, parsePartial(d, &it)
	case "BODY", "BODY.PEEK":
		if d.peek() != '[' {
			if name == "BODY.PEEK" {
				return it, syntaxErr("BODY.PEEK needs a section")
			}
			return it, nil
		}
		it.name, it.peek = "BODY[]", name == "BODY.PEEK"
	default:
		return it, syntaxErr("unknown fetch attribute")
	}
	d.accept('[')
	sec, err := parseSection(d)
	if err != nil {
		return it, err
	}
	it.sec = sec
	if err := d.expect(']'); err != nil {
		return it, err
	}
	return it, parsePartial(d, &it)
}

// parsePartial reads an optional "<" offset "." count ">".
func parsePartial(d *decoder, it *fetchItem) error {
	var err error
	if d.accept('<') {
		if it.offset, err = d.number(); err != nil {
			return err
		}
		if err := d.expect('.'); err != nil {
			return err
		}
		if it.count, err = d.number(); err != nil {
			return err
		}
		if it.count == 0 {
			return syntaxErr("partial count must be positive")
		}
		if err := d.expect('>'); err != nil {
			return err
		}
		it.partial = true
	}
	return nil
}

// parseSection reads a section-spec up to (not including) ']'.
func parseSection(d *decoder) (section, error) {
	var s section
	for d.peek() >= '1' && d.peek() <= '9' {
		n, err := d.number()
		if err != nil {
			return s, err
		}
		if len(s.path) >= 32 {
			return s, &protoError{code: "LIMIT", text: "section nested too deeply"}
		}
		s.path = append(s.path, int(n))
		if !d.accept('.') {
			return s, nil
		}
	}
	if d.peek() == ']' {
		if len(s.path) > 0 {
			return s, syntaxErr("bad section")
		}
		return s, nil
	}
	i := 0
	for i < len(d.line) && d.line[i] != ']' && d.line[i] != ' ' {
		i++
	}
	s.text = strings.ToUpper(string(d.line[:i]))
	d.line = d.line[i:]
	switch s.text {
	case "HEADER", "TEXT":
	case "MIME":
		if len(s.path) == 0 {
			return s, syntaxErr("MIME needs a part number")
		}
	case "HEADER.FIELDS", "HEADER.FIELDS.NOT":
		if err := d.sp(); err != nil {
			return s, err
		}
		s.fields = []string{}
		err := d.list(func() error {
			f, err := d.astring()
			s.fields = append(s.fields, f)
			return err
		})
		if err != nil {
			return s, err
		}
		if len(s.fields) == 0 {
			return s, syntaxErr("empty header field list")
		}
	default:
		return s, syntaxErr("bad section")
	}
	return s, nil
}

// cmdFetch: RFC 3501 section 6.4.5 and UID FETCH (section 6.4.8).
func (s *session) cmdFetch(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	set, err := d.seqSet()
	if err != nil {
		return "", err
	}
	if err := d.sp(); err != nil {
		return "", err
	}
	items, err := parseFetchAtts(d)
	if err != nil {
		return "", err
	}
	// fetch-modifier (RFC 7162 sections 3.1.4.1 and 3.2.6).
	var changedSince uint64
	hasChangedSince, vanished := false, false
	if d.accept(' ') {
		err := d.list(func() error {
			a, err := d.atom("")
			if err != nil {
				return err
			}
			switch strings.ToUpper(a) {
			case "CHANGEDSINCE":
				if err := d.sp(); err != nil {
					return err
				}
				changedSince, err = d.modSeq(true)
				hasChangedSince = true
				return err
			case "VANISHED":
				vanished = true
				return nil
			}
			return syntaxErr("unknown FETCH modifier")
		})
		if err != nil {
			return "", err
		}
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if vanished && (!c.uid || !s.qresync || !hasChangedSince) {
		return "", syntaxErr("VANISHED needs UID FETCH, CHANGEDSINCE and QRESYNC enabled")
	}
	uids, err := s.resolve(set, c.uid)
	if err != nil {
		return "", err
	}
	if c.uid && !slices.ContainsFunc(items, func(it fetchItem) bool { return it.name == "UID" }) {
		// RFC 9051 section 6.4.9: UID FETCH always returns UID, once.
		items = append([]fetchItem{{name: "UID"}}, items...)
	}
	for _, it := range items {
		if it.name == "MODSEQ" {
			s.enableCondstore()
		}
	}
	if hasChangedSince {
		s.enableCondstore()
		items = append(items, fetchItem{name: "MODSEQ"})
		if vanished {
			var err error
			if set.Saved {
				err = s.resync(ctx, changedSince, &SeqSet{Ranges: rangesOf(s.saved)}, s.view.MaxUID(), []uint32{})
			} else {
				err = s.resync(ctx, changedSince, &set, s.view.MaxUID(), []uint32{})
			}
			if err != nil {
				return "", err
			}
		}
		uids, err = s.changedSince(ctx, uids, changedSince)
		if err != nil {
			return "", err
		}
	}
	setSeen := false
	var need needs
	for _, it := range items {
		switch it.name {
		case "ENVELOPE", "BODYSTRUCTURE", "BODY":
			need.summary = true
		case "BODY[]", "BINARY[]", "BINARY.SIZE[]":
			if len(it.sec.path) > 0 {
				need.summary = true
			}
			need.body = true
			setSeen = setSeen || (!it.peek && it.name != "BINARY.SIZE[]")
		case "RFC822", "RFC822.TEXT":
			need.body, setSeen = true, true
		case "RFC822.HEADER":
			need.body = true
		}
	}
	seenNow := map[uint32]bool{}
	if setSeen && !s.view.ReadOnly() {
		changed, err := s.view.SetFlags(ctx, uids, mailbox.FlagsAdd, []string{`\Seen`})
		if err != nil {
			return "", err
		}
		for _, m := range changed {
			seenNow[m.UID] = true
		}
	}
	err = s.view.Messages(ctx, uids, func(m mailbox.Message) error {
		return s.fetchOne(ctx, m, items, need, seenNow[m.UID])
	})
	if c.uid && errors.Is(err, mailbox.ErrExpunged) {
		// RFC 9051 section 6.4.9: UIDs that do not exist are ignored.
		err = nil
	}
	if err != nil {
		return "", err
	}
	return c.name + " completed", nil
}

// changedSince returns the uids whose MODSEQ is above modseq (RFC 7162
// section 3.1.4.1).
func (s *session) changedSince(ctx context.Context, uids []uint32, modseq uint64) ([]uint32, error) {
	var out []uint32
	err := s.view.Messages(ctx, uids, func(m mailbox.Message) error {
		if m.ModSeq > modseq {
			out = append(out, m.UID)
		}
		return nil
	})
	if err != nil && !errors.Is(err, mailbox.ErrExpunged) {
		return nil, err
	}
	return out, nil
}

// resolve turns a sequence set into the UIDs it names in the view.
func (s *session) resolve(set SeqSet, byUID bool) ([]uint32, error) {
	if set.Saved {
		return s.savedUIDs(), nil
	}
	if byUID {
		return uidsByUID(set, s.view.UIDs()), nil
	}
	uids, ok := uidsBySeq(set, s.view.Len(), s.view.UID)
	if !ok {
		return nil, syntaxErr("invalid message sequence number")
	}
	return uids, nil
}

// savedUIDs returns the SEARCHRES result still in the mailbox.
func (s *session) savedUIDs() []uint32 {
	return uidsByUID(SeqSet{Ranges: rangesOf(s.saved)}, s.view.UIDs())
}

func rangesOf(uids []uint32) []SeqRange {
	r := make([]SeqRange, len(uids))
	for i, u := range uids {
		r[i] = SeqRange{u, u}
	}
	return r
}

// needs says what a FETCH must read besides the message's metadata.
type needs struct {
	body    bool // the stored message
	summary bool // its MIME summary (ENVELOPE, BODYSTRUCTURE, parts)
}

// summary returns m's MIME summary: the one stored at delivery or APPEND,
// or, for a message stored without one (or with one this version cannot
// read), parsed from the body now.
func (s *session) summary(ctx context.Context, m mailbox.Message, body *mailbox.BodyReader) (*mime.Summary, error) {
	if len(m.Meta) > 0 {
		sum, err := mime.Unmarshal(m.Meta)
		if err == nil {
			return sum, nil
		}
		s.log.Warn("imap: unreadable message summary; parsing the body", "user", s.user, "uid", m.UID, "err", err)
	}
	if *body == nil {
		b, err := s.view.Open(ctx, m)
		if err != nil {
			return nil, err
		}
		*body = b
	}
	sum, err := mime.Parse(io.NewSectionReader(*body, 0, m.Size))
	if err != nil {
		return nil, fmt.Errorf("imap: parsing UID %d: %w", m.UID, err)
	}
	if len(m.Meta) == 0 && sum.Size == m.Size && s.view.KeepsMeta() {
		if meta, err := sum.MarshalBinary(); err == nil {
			if s.metas == nil {
				s.metas = make(map[uint32][]byte)
			}
			s.metas[m.UID] = meta
			if len(s.metas) >= keepMetaBatch {
				s.keepMeta(ctx)
			}
		}
	}
	return sum, nil
}

// keepMetaBatch bounds the summaries a command holds before keeping them:
// a FETCH of a large mailbox's envelopes keeps them a batch at a time.
const keepMetaBatch = 256

// keepMeta stores the summaries computed so far (session.metas) with the
// selected mailbox's messages, in one store write, so that the next
// command that needs them reads them instead of parsing the bodies again
// (docs/adr/0011). A failure costs only that parsing: it is logged.
func (s *session) keepMeta(ctx context.Context) {
	if len(s.metas) == 0 {
		return
	}
	if s.view != nil {
		if err := s.view.KeepMeta(ctx, s.metas); err != nil {
			s.log.Warn("imap: keeping message summaries", "user", s.user, "err", err)
		}
	}
	clear(s.metas)
}

// fetchOne writes one FETCH response. Once it has begun writing, a failure
// cannot be reported in the protocol: it aborts the session.
func (s *session) fetchOne(ctx context.Context, m mailbox.Message, items []fetchItem, need needs, addFlags bool) error {
	var body mailbox.BodyReader
	defer func() {
		if body != nil {
			body.Close()
		}
	}()
	var hdrLen int64
	var hdr []byte
	if need.body {
		var err error
		if body, err = s.view.Open(ctx, m); err != nil {
			return err
		}
		if hdrLen, hdr, err = scanHeader(body, m.Size); err != nil {
			return err
		}
	}
	var sum *mime.Summary
	if need.summary {
		var err error
		if sum, err = s.summary(ctx, m, &body); err != nil {
			return err
		}
	}
	for _, it := range items {
		if it.name == "BINARY[]" || it.name == "BINARY.SIZE[]" {
			if _, enc, ok := binarySource(sum, it.sec, m.Size); ok && !knownCTE(enc) {
				return &protoError{no: true, code: "UNKNOWN-CTE", text: "unknown Content-Transfer-Encoding"}
			}
		}
	}
	e := &s.enc
	e.raw("* ").num(m.Seq).raw(" FETCH (")
	first := true
	sep := func() {
		if !first {
			e.sp()
		}
		first = false
	}
	hasFlags, hasModSeq := false, false
	for _, it := range items {
		switch it.name {
		case "FLAGS":
			hasFlags = true
		case "MODSEQ":
			hasModSeq = true
		}
	}
	for _, it := range items {
		sep()
		switch it.name {
		case "UID":
			e.raw("UID ").num(m.UID)
		case "FLAGS":
			e.raw("FLAGS ").flags(m.Flags, s.recent(m.UID))
		case "INTERNALDATE":
			e.raw("INTERNALDATE ").dateTime(m.InternalDate)
		case "RFC822.SIZE":
			e.raw("RFC822.SIZE ").num64(uint64(m.Size))
		case "MODSEQ":
			e.raw("MODSEQ (").num64(m.ModSeq).raw(")")
		case "ENVELOPE":
			s.buf = sum.AppendEnvelope(append(s.buf[:0], "ENVELOPE "...))
			e.bytes(s.buf)
		case "BODYSTRUCTURE":
			s.buf = sum.AppendBodyStructure(append(s.buf[:0], "BODYSTRUCTURE "...), true)
			e.bytes(s.buf)
		case "BODY":
			s.buf = sum.AppendBodyStructure(append(s.buf[:0], "BODY "...), false)
			e.bytes(s.buf)
		case "RFC822":
			e.raw("RFC822 ")
			if err := s.literalFrom(body, 0, m.Size); err != nil {
				return errAbort
			}
		case "RFC822.HEADER":
			e.raw("RFC822.HEADER ")
			if err := s.literalFrom(body, 0, hdrLen); err != nil {
				return errAbort
			}
		case "RFC822.TEXT":
			e.raw("RFC822.TEXT ")
			if err := s.literalFrom(body, hdrLen, m.Size-hdrLen); err != nil {
				return errAbort
			}
		case "BINARY[]", "BINARY.SIZE[]":
			if err := s.writeBinary(m, body, sum, it); err != nil {
				s.log.Warn("imap: reading message body", "user", s.user, "err", err)
				return errAbort
			}
		case "BODY[]":
			e.raw("BODY[").raw(it.sec.String()).raw("]")
			var start, n int64
			var data []byte
			if len(it.sec.path) > 0 {
				r, ok := partRange(sum, it.sec)
				if !ok {
					// RFC 9051 section 6.4.5: a part that does not exist
					// reads as empty.
					e.raw(" NIL")
					continue
				}
				start, n = r.Start, r.Len()
				if it.sec.fields != nil {
					if hdr, err := readRange(body, r, maxHeaderKept); err != nil {
						return errAbort
					} else {
						data = filterHeader(hdr, it.sec.fields, it.sec.text == "HEADER.FIELDS.NOT")
						n = int64(len(data))
					}
				}
			} else {
				switch it.sec.text {
				case "":
					start, n = 0, m.Size
				case "HEADER":
					start, n = 0, hdrLen
				case "TEXT":
					start, n = hdrLen, m.Size-hdrLen
				default:
					data = filterHeader(hdr, it.sec.fields, it.sec.text == "HEADER.FIELDS.NOT")
					n = int64(len(data))
				}
			}
			if it.partial {
				e.raw("<").num(it.offset).raw(">")
				off := min(int64(it.offset), n)
				start, n = start+off, min(n-off, int64(it.count))
				if data != nil {
					data = data[off : off+n]
				}
			}
			e.sp()
			if data != nil {
				e.raw("{").num64(uint64(len(data))).raw("}\r\n").bytes(data)
			} else if err := s.literalFrom(body, start, n); err != nil {
				return errAbort
			}
		}
	}
	if addFlags && !hasFlags {
		sep()
		e.raw("FLAGS ").flags(m.Flags, s.recent(m.UID))
		if s.condstore && !hasModSeq {
			e.raw(" MODSEQ (").num64(m.ModSeq).raw(")")
		}
	}
	e.raw(")").crlf()
	return nil
}

// partRange locates a section with part numbers (RFC 9051 section 6.4.5).
// HEADER, HEADER.FIELDS and TEXT of a part exist only for a
// message/rfc822 part.
func partRange(sum *mime.Summary, sec section) (mime.Range, bool) {
	pi, ok := sum.Part(sec.path)
	if !ok {
		return mime.Range{}, false
	}
	switch sec.text {
	case "":
		return pi.Body, true
	case "MIME":
		return pi.MIME, true
	case "TEXT":
		return pi.Text, pi.IsMessage
	default: // HEADER, HEADER.FIELDS(.NOT)
		return pi.Header, pi.IsMessage
	}
}

// readRange reads up to max octets of r.
func readRange(body io.ReaderAt, r mime.Range, max int64) ([]byte, error) {
	buf := make([]byte, min(r.Len(), max))
	if _, err := body.ReadAt(buf, r.Start); err != nil && err != io.EOF {
		return nil, err
	}
	return buf, nil
}

// bodyBufSize is what a session's output buffer grows to once it sends a
// message body (textconn.Conn.GrowWriteBuffer): the literals of a FETCH
// over many messages then share network writes instead of taking one or
// more each.
const bodyBufSize = 32 << 10

// literalFrom writes n octets of r from off as a literal.
func (s *session) literalFrom(r io.ReaderAt, off, n int64) error {
	if err := s.conn.GrowWriteBuffer(bodyBufSize); err != nil {
		return err
	}
	s.enc.raw("{").num64(uint64(n)).raw("}\r\n")
	if n == 0 {
		return nil
	}
	_, err := io.Copy(s.conn, io.NewSectionReader(r, off, n))
	if err != nil {
		s.log.Warn("imap: reading message body", "user", s.user, "err", err)
	}
	return err
}

// maxHeaderKept bounds the header octets kept in memory for
// HEADER.FIELDS; fields beyond it are not found.
const maxHeaderKept = 256 << 10

// scanHeader finds the end of the message header (after the empty line
// that ends it, RFC 5322 section 2.1; the whole message if there is none)
// and returns its length and up to maxHeaderKept octets of it.
func scanHeader(r io.ReaderAt, size int64) (int64, []byte, error) {
	br := bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 16<<10)
	var kept []byte
	var n int64
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			n += int64(len(line))
			if len(kept)+len(line) <= maxHeaderKept {
				kept = append(kept, line...)
			}
			continue
		}
		n += int64(len(line))
		if len(kept)+len(line) <= maxHeaderKept {
			kept = append(kept, line...)
		}
		if err == io.EOF {
			return n, kept, nil
		}
		if err != nil {
			return 0, nil, err
		}
		if len(line) <= 2 && (string(line) == "\r\n" || string(line) == "\n") {
			return n, kept, nil
		}
	}
}

// filterHeader returns the fields of hdr named (or, with not, not named)
// in fields, followed by the empty line (RFC 9051 section 6.4.5).
func filterHeader(hdr []byte, fields []string, not bool) []byte {
	var out []byte
	keep := false
	for len(hdr) > 0 {
		i := bytes.IndexByte(hdr, '\n')
		line := hdr
		if i >= 0 {
			line = hdr[:i+1]
		}
		hdr = hdr[len(line):]
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			break
		}
		if line[0] != ' ' && line[0] != '\t' {
			name, _, ok := bytes.Cut(line, []byte(":"))
			keep = false
			if ok {
				named := false
				for _, f := range fields {
					if strings.EqualFold(f, string(bytes.TrimSpace(name))) {
						named = true
						break
					}
				}
				keep = named != not
			}
		}
		if keep {
			out = append(out, line...)
		}
	}
	return append(out, '\r', '\n')
}
