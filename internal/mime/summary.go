// Package mime computes the structure of a message once, when it is
// stored, so that metadata is served forever without re-reading the body:
// the RFC 5322 header fields IMAP needs (ENVELOPE and the SORT/THREAD keys
// of RFC 5256), and the MIME tree (RFC 2045-2049) with the byte offsets of
// every part, so that BODY[section] and partial <n.m> fetches are range
// reads of the stored blob.
//
// A Summary is built by a Parser, an io.Writer that a message can be teed
// into while it streams to storage, or by Parse. Parsing never fails:
// malformed mail (missing or broken boundaries, bad encodings, 8-bit header
// bytes, LF-only lines, absurd nesting) degrades to the closest valid
// structure, as Dovecot does, and is reported in Summary.Anomalies.
//
// The package is a pure leaf: it performs no I/O besides consuming bytes.
// Summary.MarshalBinary and Unmarshal give the compact, versioned encoding
// kept in store.Message.Meta; AppendEnvelope and AppendBodyStructure render
// the IMAP forms of RFC 3501 section 7.4.2 and RFC 9051 section 7.5.2.
package mime

// Param is one MIME parameter (RFC 2045 section 5.1). Name is lower case;
// Value is unquoted. RFC 2231 continuations are kept as they appear
// (name*0, name*1*), which is what IMAP BODYSTRUCTURE shows.
type Param struct {
	Name, Value string
}

// Address is one element of an ENVELOPE address list (RFC 3501 section
// 7.4.2): a mailbox, or a group marker. A group starts with an Address
// whose Host is "" and Mailbox is the group's name, and ends with one whose
// Host and Mailbox are both "". A mailbox always has a non-empty Mailbox
// and Host: a missing part is filled in as MissingMailbox or MissingDomain.
//
// Name is the display name as it appears (quoted strings unquoted, runs of
// white space collapsed) and is never RFC 2047-decoded: IMAP returns it raw.
type Address struct {
	Name    string // display name, or "" (NIL)
	Route   string // obsolete source route "@a,@b", or "" (NIL)
	Mailbox string // local part, or the group name
	Host    string // domain; "" only in group markers
}

// Placeholders for the parts of a malformed address, as Dovecot uses them.
const (
	MissingMailbox = "MISSING_MAILBOX"
	MissingDomain  = "MISSING_DOMAIN"
)

// IsGroupStart reports whether a starts a group (a.Mailbox is its name).
func (a Address) IsGroupStart() bool { return a.Host == "" && a.Mailbox != "" }

// IsGroupEnd reports whether a ends a group.
func (a Address) IsGroupEnd() bool { return a.Host == "" && a.Mailbox == "" }

// Envelope holds the fields of an IMAP ENVELOPE. Strings are the raw,
// unfolded header values with surrounding white space removed; "" is NIL.
// Sender and ReplyTo are empty when the header lacks them: the rendering
// substitutes From, as RFC 3501 section 7.4.2 requires.
type Envelope struct {
	Date, Subject                      string
	From, Sender, ReplyTo, To, Cc, Bcc []Address
	InReplyTo, MessageID               string
}

// Part is one MIME entity: the message itself, a part of a multipart, or
// the message encapsulated in a message/rfc822 part. Offsets are octets
// from the start of the stored message:
//
//	HeaderStart <= BodyStart <= End <= Summary.Size
//
// [HeaderStart, BodyStart) is the header including the blank line that ends
// it; [BodyStart, End) is the body. The line break before a boundary
// delimiter belongs to the delimiter (RFC 2046 section 5.1.1), not to the
// part that precedes it.
type Part struct {
	HeaderStart, BodyStart, End int64
	// Lines is the number of lines of the body: the line feeds in it, plus
	// one for a last line that has no line feed.
	Lines int64

	Type, Subtype string // lower case; "text", "plain" when absent
	Params        []Param
	// ID, Description, Encoding, MD5 and Location are the trimmed values of
	// Content-ID, Content-Description, Content-Transfer-Encoding (lower
	// case), Content-MD5 and Content-Location; "" when absent.
	ID, Description, Encoding, MD5, Location string
	Disposition                              string // lower case, "" when absent
	DispositionParams                        []Param
	Language                                 []string

	// Children are the parts of a multipart, in order. A multipart that has
	// none is rendered with one empty text/plain part, as IMAP requires one.
	Children []*Part
	// Message is the encapsulated message of a message/rfc822 part, whose
	// HeaderStart is this part's BodyStart; Envelope is its envelope.
	Message  *Part
	Envelope *Envelope

	// defaultType records that the entity had no usable Content-Type, so
	// the RFC 2045 section 5.2 default (charset us-ascii) is shown.
	defaultType bool
}

// IsMultipart reports whether p is a multipart with its children parsed.
func (p *Part) IsMultipart() bool { return p.Type == "multipart" }

// IsMessage reports whether p is a message/rfc822 part with its
// encapsulated message parsed.
func (p *Part) IsMessage() bool { return p.Message != nil }

// Param returns the value of p's parameter name (lower case), if present.
func (p *Part) Param(name string) (string, bool) {
	for _, x := range p.Params {
		if x.Name == name {
			return x.Value, true
		}
	}
	return "", false
}

// Charset returns the charset parameter, lower case, with the RFC 2045
// default "us-ascii" for text parts that lack one.
func (p *Part) Charset() string {
	if v, ok := p.Param("charset"); ok {
		return lower(v)
	}
	if p.Type == "text" {
		return "us-ascii"
	}
	return ""
}

// Anomaly is a set of the ways a message was malformed. None of them makes
// parsing fail; each one says how the structure was degraded.
type Anomaly uint32

const (
	// AnomalyNoBoundary: a multipart without a usable boundary parameter,
	// shown as text/plain.
	AnomalyNoBoundary Anomaly = 1 << iota
	// AnomalyUnclosed: a multipart ended without its close delimiter, or a
	// part was cut short by an enclosing boundary.
	AnomalyUnclosed
	// AnomalyDepth: nesting beyond MaxDepth, shown as text/plain.
	AnomalyDepth
	// AnomalyParts: more than MaxParts parts; the rest is part of the body
	// of the last one.
	AnomalyParts
	// AnomalyHeader: a header line that is not a field, a header without
	// its blank line, or a field longer than MaxFieldLen (truncated).
	AnomalyHeader
	// AnomalyContentType: an unparseable Content-Type, replaced with the
	// default.
	AnomalyContentType
)

var anomalyNames = []string{"no-boundary", "unclosed", "depth", "parts", "header", "content-type"}

func (a Anomaly) String() string {
	if a == 0 {
		return "none"
	}
	var b []byte
	for i, n := range anomalyNames {
		if a&(1<<i) != 0 {
			if len(b) > 0 {
				b = append(b, ',')
			}
			b = append(b, n...)
		}
	}
	return string(b)
}

// Summary is everything Quill keeps about a message's content.
type Summary struct {
	Size      int64 // octets of the whole message
	Root      *Part // the message itself: HeaderStart 0, End Size
	Envelope  Envelope
	Anomalies Anomaly

	// The keys RFC 5256 SORT and THREAD need, derived once.
	// Date is the Date header field as seconds since the Unix epoch, and
	// DateZone its zone offset in minutes; HasDate is false when the field
	// is absent or unparseable (SORT then uses the internal date).
	Date     int64
	DateZone int16
	HasDate  bool
	// BaseSubject is the RFC 5256 section 2.1 base subject (UTF-8, encoded
	// words decoded); IsReplyOrForward reports whether extracting it removed
	// a reply or forward marker.
	BaseSubject      string
	IsReplyOrForward bool
	// References are the message ids of the References field, in order,
	// with their angle brackets.
	References []string
	// display holds the RFC 5957 DISPLAY keys of From, To and Cc when they
	// differ from the raw display name (encoded words decoded).
	display [3]string
}

// AddressField names an address header for the SORT keys.
type AddressField int

const (
	From AddressField = iota
	To
	Cc
)

func (s *Summary) list(f AddressField) []Address {
	switch f {
	case From:
		return s.Envelope.From
	case To:
		return s.Envelope.To
	case Cc:
		return s.Envelope.Cc
	}
	return nil
}

func firstMailbox(l []Address) (Address, bool) {
	for _, a := range l {
		if a.Host != "" {
			return a, true
		}
	}
	return Address{}, false
}

// SortMailbox returns the RFC 5256 SORT key for FROM, TO or CC: the local
// part of the first address, or "".
func (s *Summary) SortMailbox(f AddressField) string {
	a, _ := firstMailbox(s.list(f))
	return a.Mailbox
}

// SortDisplay returns the RFC 5957 DISPLAY key: the decoded display name of
// the first address or, without one, its addr-spec; "" without an address.
func (s *Summary) SortDisplay(f AddressField) string {
	if f >= From && f <= Cc && s.display[f] != "" {
		return s.display[f]
	}
	a, ok := firstMailbox(s.list(f))
	switch {
	case !ok:
		return ""
	case a.Name != "":
		return a.Name
	default:
		return a.Mailbox + "@" + a.Host
	}
}

// MessageID returns the first msg-id of the Message-ID field, with angle
// brackets, or "".
func (s *Summary) MessageID() string {
	ids := parseMsgIDs(s.Envelope.MessageID, 1)
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// ThreadParents returns the parent ids that RFC 5256 THREAD=REFERENCES
// uses: the References ids or, without them, the first msg-id of
// In-Reply-To.
func (s *Summary) ThreadParents() []string {
	if len(s.References) > 0 {
		return s.References
	}
	return parseMsgIDs(s.Envelope.InReplyTo, 1)
}

// Range is a byte range [Start, End) of the stored message.
type Range struct {
	Start, End int64
}

// Len returns the number of octets in r.
func (r Range) Len() int64 { return r.End - r.Start }

// PartInfo locates one section of a message for BODY[section] (RFC 3501
// section 6.4.5, RFC 9051 section 6.4.5).
type PartInfo struct {
	// Part is the entity; it belongs to the Summary and must not be changed.
	Part *Part
	// MIME is the part's MIME header, BODY[n.MIME]; for the whole message
	// it is the message header.
	MIME Range
	// Body is the part's content, BODY[n]; for the whole message, all of
	// it (BODY[]).
	Body Range
	// IsMessage reports whether Header and Text are valid: the section is
	// the whole message or a message/rfc822 part, and Header and Text are
	// the encapsulated message's BODY[n.HEADER] and BODY[n.TEXT].
	IsMessage    bool
	Header, Text Range
}

// Part locates the section with the given part numbers (1-based); an
// empty path is the whole message. It reports false when no such part
// exists.
func (s *Summary) Part(path []int) (PartInfo, bool) {
	root := s.Root
	if root == nil {
		return PartInfo{}, false
	}
	if len(path) == 0 {
		return PartInfo{
			Part: root, MIME: Range{0, root.BodyStart}, Body: Range{0, s.Size}, IsMessage: true,
			Header: Range{0, root.BodyStart}, Text: Range{root.BodyStart, root.End},
		}, true
	}
	// RFC 3501 section 6.4.5: a non-multipart message has only part 1,
	// itself; the parts of a multipart are numbered from 1; the parts of a
	// message/rfc822 are those of its encapsulated message's body.
	var cur *Part
	next := root
	for _, n := range path {
		if cur != nil {
			if cur.Message == nil && !cur.IsMultipart() {
				return PartInfo{}, false
			}
			if cur.Message != nil {
				next = cur.Message
			} else {
				next = cur
			}
		}
		switch {
		case next.IsMultipart():
			if n < 1 || n > len(next.Children) {
				return PartInfo{}, false
			}
			cur = next.Children[n-1]
		case n == 1:
			cur = next
		default:
			return PartInfo{}, false
		}
	}
	pi := PartInfo{Part: cur, MIME: Range{cur.HeaderStart, cur.BodyStart}, Body: Range{cur.BodyStart, cur.End}}
	if m := cur.Message; m != nil {
		pi.IsMessage = true
		pi.Header = Range{m.HeaderStart, m.BodyStart}
		pi.Text = Range{m.BodyStart, m.End}
	}
	return pi, true
}

func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; 'A' <= c && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
