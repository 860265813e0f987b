package mime

import (
	"bytes"
	"io"
)

// Limits that bound the parser's memory and the summary's size whatever
// the message. Beyond them the structure degrades (see Anomaly); the
// message is never refused.
const (
	// MaxDepth bounds the nesting of multiparts and message/rfc822 parts;
	// deeper ones are shown as text/plain.
	MaxDepth = 32
	// MaxParts bounds the number of parts of a message; further delimiters
	// are part of the body of the last one.
	MaxParts = 1000
	// MaxFieldLen bounds a retained header field value (after unfolding);
	// the rest is dropped.
	MaxFieldLen = 8 << 10
	// maxBoundary bounds a usable boundary; RFC 2046 allows 70 characters.
	maxBoundary = 200
	// maxLineKeep bounds how much of one line the parser looks at. Longer
	// lines are still counted and offset correctly.
	maxLineKeep = MaxFieldLen + 2
	// maxParams bounds the parameters kept per header field.
	maxParams = 32
)

// Parser computes a Summary from a message written to it, in any number of
// Writes; it never fails and holds a bounded amount of memory. It is meant
// to be teed into while the message streams to storage:
//
//	p := mime.NewParser()
//	blob, size, err := st.PutBlob(ctx, io.TeeReader(body, p), max)
//	sum := p.Summary()
//
// A Parser is not safe for concurrent use.
type Parser struct {
	off    int64 // octets written so far
	nl     int64 // line feeds written so far
	line   []byte
	lastCR bool  // the current line's last octet so far is CR
	lnLen  int64 // octets of the current line so far
	stack  []*frame
	parts  int
	prev   lineEnd // the previous line, for the delimiter's line break
	hdr    headerCollector
	sum    Summary
	closed bool
}

// lineEnd remembers where a line ended: how long its line break was, and
// whether its content was empty (then the octet before the line break's
// start is itself a line feed, or the start of the message).
type lineEnd struct {
	term  int64
	empty bool
}

type state uint8

const (
	stHeader   state = iota // collecting the entity's header
	stLeaf                  // a leaf body, or a message/rfc822 body (child on top)
	stPreamble              // multipart before its first delimiter
	stParts                 // multipart after a delimiter (child on top)
	stEpilogue              // multipart after its close delimiter
)

type frame struct {
	part     *Part
	st       state
	boundary []byte // "--" + boundary, for multiparts in stPreamble/stParts
	nlBody   int64  // line feeds before BodyStart
	message  bool   // a message entity (root or encapsulated): collect envelope fields
	env      *Envelope
	depth    int
}

// NewParser returns a Parser for one message.
func NewParser() *Parser {
	p := &Parser{line: make([]byte, 0, 256)}
	root := &Part{}
	p.sum.Root = root
	p.stack = append(p.stack, &frame{part: root, st: stHeader, message: true, env: &p.sum.Envelope})
	p.hdr.reset(true)
	return p
}

// Parse reads a message from r to EOF and returns its summary. The error is
// r's; the summary is never nil and describes what was read.
func Parse(r io.Reader) (*Summary, error) {
	p := NewParser()
	_, err := io.Copy(p, r)
	return p.Summary(), err
}

// Write consumes the next octets of the message. It never fails.
func (p *Parser) Write(b []byte) (int, error) {
	if p.closed {
		return len(b), nil
	}
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.partial(b)
			p.off += int64(len(b))
			break
		}
		seg := b[:i+1]
		b = b[i+1:]
		p.off += int64(len(seg))
		p.nl++
		var term int64 = 1
		if (len(seg) >= 2 && seg[len(seg)-2] == '\r') || (len(seg) == 1 && p.lastCR) {
			term = 2
		}
		if p.lnLen == 0 {
			// The whole line is in this Write: look at it in place.
			p.lnLen = int64(len(seg))
			p.endLine(clip(seg[:int64(len(seg))-term]), term)
			continue
		}
		p.partial(seg)
		content := p.line
		if p.lnLen <= maxLineKeep {
			content = content[:p.lnLen-term]
		}
		p.endLine(content, term)
	}
	return n, nil
}

func clip(b []byte) []byte {
	if len(b) > maxLineKeep {
		return b[:maxLineKeep]
	}
	return b
}

// partial adds a piece of a line that may continue in a later Write.
func (p *Parser) partial(b []byte) {
	if p.lnLen == 0 {
		p.line = p.line[:0]
	}
	if room := maxLineKeep - len(p.line); room > 0 {
		p.line = append(p.line, b[:min(room, len(b))]...)
	}
	p.lnLen += int64(len(b))
	p.lastCR = b[len(b)-1] == '\r'
}

// Summary finishes parsing (an unterminated last line is a line) and
// returns the summary. Later Writes are ignored.
func (p *Parser) Summary() *Summary {
	if p.closed {
		return &p.sum
	}
	if p.lnLen > 0 {
		p.endLine(p.line, 0)
	}
	p.closed = true
	p.sum.Size = p.off
	for len(p.stack) > 0 {
		p.closeTop(p.off, p.nl, p.prev.term > 0 || p.off == 0)
	}
	p.line = nil
	return &p.sum
}

// endLine handles one line of lnLen octets: content is what was kept of it
// without its line break, term the line break's length (0 for an
// unterminated last line).
func (p *Parser) endLine(content []byte, term int64) {
	start := p.off - p.lnLen
	p.handle(start, content, term)
	p.prev = lineEnd{term: term, empty: p.lnLen == term}
	p.lnLen = 0
	p.lastCR = false
}

// handle dispatches one line that starts at start. Delimiters are
// recognised in every state, innermost multipart first, so that a missing
// close delimiter of an inner multipart is ended by an outer one. A
// delimiter matches by prefix ("--" boundary, anything after it), which is
// how real-world parsers read transport padding and sloppy mailers.
func (p *Parser) handle(start int64, line []byte, term int64) {
	if len(line) >= 2 && line[0] == '-' && line[1] == '-' {
		for i := len(p.stack) - 1; i >= 0; i-- {
			f := p.stack[i]
			if (f.st != stPreamble && f.st != stParts) || !bytes.HasPrefix(line, f.boundary) {
				continue
			}
			rest := line[len(f.boundary):]
			closing := len(rest) >= 2 && rest[0] == '-' && rest[1] == '-'
			if !closing && p.parts >= MaxParts {
				p.sum.Anomalies |= AnomalyParts
				break
			}
			// RFC 2046 section 5.1.1: the line break before the delimiter
			// is part of it, not of the part that ends here.
			end, nl, lastLF := start-p.prev.term, p.nlBefore(term), p.prev.empty || p.prev.term == 0
			if p.prev.term > 0 {
				nl--
			}
			if top := p.stack[len(p.stack)-1]; len(p.stack)-1 > i {
				// When that line break already ended the innermost header
				// (or the previous delimiter), the part is empty and ends
				// here, so that no part ends before its own body starts.
				lo := top.part.BodyStart
				if top.st == stHeader {
					lo = top.part.HeaderStart
				}
				if end < lo {
					end, nl, lastLF = start, p.nlBefore(term), true
				}
			}
			for len(p.stack)-1 > i {
				p.closeTop(end, nl, lastLF)
			}
			if closing {
				f.st = stEpilogue
				return
			}
			f.st = stParts
			p.parts++
			child := &Part{HeaderStart: start + p.lnLen}
			f.part.Children = append(f.part.Children, child)
			p.push(&frame{part: child, depth: f.depth + 1})
			return
		}
	}
	if top := p.stack[len(p.stack)-1]; top.st == stHeader {
		p.headerLine(top, start, line, term)
	}
}

// nlBefore returns the number of line feeds before the current line.
func (p *Parser) nlBefore(term int64) int64 {
	if term > 0 {
		return p.nl - 1
	}
	return p.nl
}

func (p *Parser) push(f *frame) {
	p.stack = append(p.stack, f)
	p.hdr.reset(f.message)
}

// headerLine handles a line of top's header (RFC 5322 section 2.2).
func (p *Parser) headerLine(top *frame, start int64, line []byte, term int64) {
	if int64(len(line)) < p.lnLen-term {
		p.sum.Anomalies |= AnomalyHeader // a line longer than maxLineKeep, clipped
	}
	switch {
	case len(line) == 0:
		p.endHeader(top, start+p.lnLen, p.nl, true)
	case line[0] == ' ' || line[0] == '\t':
		p.hdr.continued(line)
	default:
		if name, value, ok := splitField(line); ok {
			p.hdr.field(name, value)
			return
		}
		// Not a field: the header ends without its blank line and this
		// line is the first of the body.
		p.sum.Anomalies |= AnomalyHeader
		p.endHeader(top, start, p.nlBefore(term), true)
		if next := p.stack[len(p.stack)-1]; next != top && next.st == stHeader {
			p.headerLine(next, start, line, term)
		}
	}
}

// splitField splits a header field line at its colon. The name must be
// printable and free of white space, except before the colon (RFC 5322
// section 4.5, obs-optional).
func splitField(line []byte) (name, value []byte, ok bool) {
	i := bytes.IndexByte(line, ':')
	if i <= 0 {
		return nil, nil, false
	}
	name = bytes.TrimRight(line[:i], " \t")
	if len(name) == 0 {
		return nil, nil, false
	}
	for _, c := range name {
		if c <= ' ' || c == 0x7f {
			return nil, nil, false
		}
	}
	return name, line[i+1:], true
}

// endHeader ends the header of f's entity at bodyStart and decides, from
// its fields, how its body is read. With open false the entity ends where
// its header does (it was cut short), so nothing is pushed.
func (p *Parser) endHeader(f *frame, bodyStart, nl int64, open bool) {
	part := f.part
	part.BodyStart = max(bodyStart, part.HeaderStart)
	f.nlBody = nl
	p.sum.Anomalies |= p.hdr.apply(part)
	if f.message {
		p.hdr.envelope(f.env)
		if f.env == &p.sum.Envelope {
			p.hdr.sortKeys(&p.sum)
		}
	}
	f.st = stLeaf
	switch {
	case part.Type == "multipart":
		b, _ := part.Param("boundary")
		if b == "" || len(b) > maxBoundary {
			p.sum.Anomalies |= AnomalyNoBoundary
			part.degrade()
			return
		}
		if f.depth >= MaxDepth {
			p.sum.Anomalies |= AnomalyDepth
			part.degrade()
			return
		}
		f.st = stPreamble
		f.boundary = append([]byte("--"), b...)
	case part.Type == "message" && part.Subtype == "rfc822":
		if f.depth >= MaxDepth || p.parts >= MaxParts {
			if f.depth >= MaxDepth {
				p.sum.Anomalies |= AnomalyDepth
			} else {
				p.sum.Anomalies |= AnomalyParts
			}
			part.degrade()
			return
		}
		p.parts++
		inner := &Part{HeaderStart: part.BodyStart}
		part.Message, part.Envelope = inner, &Envelope{}
		if !open {
			inner.BodyStart, inner.End, inner.Type, inner.Subtype, inner.defaultType = part.BodyStart, part.BodyStart, "text", "plain", true
			return
		}
		p.push(&frame{part: inner, message: true, env: part.Envelope, depth: f.depth + 1})
	}
}

// degrade turns a container that cannot be parsed as one into the default
// text/plain leaf (RFC 2045 section 5.2), keeping its other fields.
func (part *Part) degrade() {
	part.Type, part.Subtype, part.Params, part.defaultType = "text", "plain", nil, true
}

// closeTop ends the innermost entity at pos; nl is the number of line feeds
// before pos and lastLF whether the octet before pos is a line feed (or
// there is none).
func (p *Parser) closeTop(pos, nl int64, lastLF bool) {
	f := p.stack[len(p.stack)-1]
	part := f.part
	p.stack = p.stack[:len(p.stack)-1]
	if f.st == stHeader {
		if pos > part.HeaderStart {
			p.sum.Anomalies |= AnomalyHeader // a header without its blank line
		}
		p.endHeader(f, pos, nl, false)
	}
	if f.st == stPreamble || f.st == stParts {
		p.sum.Anomalies |= AnomalyUnclosed
	}
	part.End = max(pos, part.BodyStart)
	if part.End > part.BodyStart {
		part.Lines = nl - f.nlBody
		if !lastLF {
			part.Lines++
		}
	}
	if m := part.Message; m != nil && m.End < m.BodyStart {
		m.End = m.BodyStart
	}
}
