package mime

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The binary encoding kept in store.Message.Meta. Layout of version 1, all
// integers unsigned varints unless marked (zig-zag varints):
//
//	version(1) flags anomalies size [date(zz) zone(zz)] str(baseSubject)
//	n str(reference)*n str(display)*3 envelope part
//	envelope = str(date) str(subject) list*6 (from sender reply-to to cc bcc)
//	           str(in-reply-to) str(message-id)
//	list     = n (str(name) str(route) str(mailbox) str(host))*n
//	part     = bits headerStart-base bodyStart-headerStart end-bodyStart lines
//	           str(type) str(subtype) params [optional strings by bits]
//	           [n part*n if multipart] [envelope part if message]
//	params   = n (str(name) str(value))*n
//
// A part's base is its parent's BodyStart for the first child and the
// previous sibling's End after that, so offsets are small numbers. A str is
// either 2*i for entry i of the frozen dictionary below or 2*len+1 followed
// by the octets.
const version1 = 1

// Errors of Unmarshal. A caller holding the blob can recover from either by
// parsing the message again.
var (
	ErrCorrupt = errors.New("mime: corrupt summary")
	ErrVersion = errors.New("mime: unknown summary version")
)

// dict is the string dictionary of version 1. It is frozen: changing it
// changes the meaning of stored summaries, so it needs a new version.
var dict = [...]string{
	"", "text", "plain", "html", "multipart", "mixed", "alternative", "related",
	"message", "rfc822", "application", "octet-stream", "image", "7bit", "8bit",
	"quoted-printable", "base64", "charset", "us-ascii", "utf-8", "iso-8859-1",
	"name", "filename", "attachment", "inline", "boundary", "format", "flowed",
	"delsp", "report", "signed", "pdf", "jpeg", "png", "gif", "calendar",
	"pkcs7-signature", "binary", "windows-1252", "protocol", "type", "delivery-status",
	"rfc822-headers", "size", "creation-date", "modification-date", "en", "yes", "no",
	"pgp-signature", "application/pgp-signature", "micalg", "method", "REQUEST",
	"iso-8859-15", "UTF-8", "US-ASCII", "ISO-8859-1",
}

// Part bits of version 1.
const (
	pbDefaultType = 1 << iota
	pbMultipart
	pbMessage
	pbID
	pbDescription
	pbEncoding
	pbMD5
	pbLocation
	pbDisposition
	pbLanguage
)

// Summary flag bits of version 1.
const (
	sfHasDate = 1 << iota
	sfReplyOrForward
)

// MarshalBinary encodes s in the current version.
func (s *Summary) MarshalBinary() ([]byte, error) {
	return s.AppendBinary(make([]byte, 0, 256))
}

// AppendBinary appends the encoding of s to b.
func (s *Summary) AppendBinary(b []byte) ([]byte, error) {
	e := encoder{b: b}
	if s.Root == nil {
		return nil, fmt.Errorf("mime: encoding a summary without a root part")
	}
	e.b = append(e.b, version1)
	var flags uint64
	if s.HasDate {
		flags |= sfHasDate
	}
	if s.IsReplyOrForward {
		flags |= sfReplyOrForward
	}
	e.uint(flags)
	e.uint(uint64(s.Anomalies))
	e.uint(uint64(s.Size))
	if s.HasDate {
		e.b = binary.AppendVarint(e.b, s.Date)
		e.b = binary.AppendVarint(e.b, int64(s.DateZone))
	}
	e.str(s.BaseSubject)
	e.uint(uint64(len(s.References)))
	for _, r := range s.References {
		e.str(r)
	}
	for _, d := range s.display {
		e.str(d)
	}
	e.envelope(&s.Envelope)
	e.part(s.Root, 0)
	return e.b, nil
}

type encoder struct {
	b []byte
}

func (e *encoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }

func (e *encoder) str(s string) {
	if len(s) < 16 {
		for i, d := range dict {
			if d == s {
				e.uint(uint64(i) << 1)
				return
			}
		}
	}
	e.uint(uint64(len(s))<<1 | 1)
	e.b = append(e.b, s...)
}

func (e *encoder) envelope(env *Envelope) {
	e.str(env.Date)
	e.str(env.Subject)
	for _, l := range [...][]Address{env.From, env.Sender, env.ReplyTo, env.To, env.Cc, env.Bcc} {
		e.uint(uint64(len(l)))
		for _, a := range l {
			e.str(a.Name)
			e.str(a.Route)
			e.str(a.Mailbox)
			e.str(a.Host)
		}
	}
	e.str(env.InReplyTo)
	e.str(env.MessageID)
}

func (e *encoder) params(ps []Param) {
	e.uint(uint64(len(ps)))
	for _, p := range ps {
		e.str(p.Name)
		e.str(p.Value)
	}
}

func (e *encoder) part(p *Part, base int64) {
	var bits uint64
	opt := [...]struct {
		bit uint64
		s   string
	}{{pbID, p.ID}, {pbDescription, p.Description}, {pbEncoding, p.Encoding}, {pbMD5, p.MD5}, {pbLocation, p.Location}}
	for _, o := range opt {
		if o.s != "" {
			bits |= o.bit
		}
	}
	if p.defaultType {
		bits |= pbDefaultType
	}
	if p.IsMultipart() {
		bits |= pbMultipart
	}
	if p.Message != nil {
		bits |= pbMessage
	}
	if p.Disposition != "" {
		bits |= pbDisposition
	}
	if len(p.Language) > 0 {
		bits |= pbLanguage
	}
	e.uint(bits)
	e.uint(uint64(p.HeaderStart - base))
	e.uint(uint64(p.BodyStart - p.HeaderStart))
	e.uint(uint64(p.End - p.BodyStart))
	e.uint(uint64(p.Lines))
	e.str(p.Type)
	e.str(p.Subtype)
	e.params(p.Params)
	for _, o := range opt {
		if o.s != "" {
			e.str(o.s)
		}
	}
	if p.Disposition != "" {
		e.str(p.Disposition)
		e.params(p.DispositionParams)
	}
	if len(p.Language) > 0 {
		e.uint(uint64(len(p.Language)))
		for _, l := range p.Language {
			e.str(l)
		}
	}
	if p.IsMultipart() {
		e.uint(uint64(len(p.Children)))
		next := p.BodyStart
		for _, c := range p.Children {
			e.part(c, next)
			next = c.End
		}
	}
	if p.Message != nil {
		env := p.Envelope
		if env == nil {
			env = &Envelope{}
		}
		e.envelope(env)
		e.part(p.Message, p.BodyStart)
	}
}

// Unmarshal decodes a summary encoded by MarshalBinary. It checks every
// offset, so a decoded summary satisfies the invariants of Part whatever
// the input; corrupt input yields ErrCorrupt, never a panic.
func Unmarshal(b []byte) (*Summary, error) {
	s := new(Summary)
	if err := s.UnmarshalBinary(b); err != nil {
		return nil, err
	}
	return s, nil
}

// UnmarshalBinary decodes b into s; see Unmarshal.
func (s *Summary) UnmarshalBinary(b []byte) error {
	if len(b) == 0 {
		return ErrCorrupt
	}
	if b[0] != version1 {
		return fmt.Errorf("%w: %d", ErrVersion, b[0])
	}
	d := decoder{b: b[1:]}
	*s = Summary{}
	flags := d.uint()
	s.Anomalies = Anomaly(d.uint())
	size := d.uint()
	if size > 1<<62 {
		d.fail()
	}
	s.Size = int64(size)
	if flags&sfHasDate != 0 {
		s.HasDate = true
		s.Date = d.int()
		z := d.int()
		if z < -24*60 || z > 24*60 {
			d.fail()
		}
		s.DateZone = int16(z)
	}
	s.IsReplyOrForward = flags&sfReplyOrForward != 0
	s.BaseSubject = d.str()
	if n := d.count(); n > 0 {
		s.References = make([]string, n)
		for i := range s.References {
			s.References[i] = d.str()
		}
	}
	for i := range s.display {
		s.display[i] = d.str()
	}
	d.envelope(&s.Envelope)
	s.Root = d.part(0, s.Size, 0)
	if d.err != nil {
		*s = Summary{}
		return d.err
	}
	if len(d.b) != 0 || s.Root.HeaderStart != 0 {
		*s = Summary{}
		return ErrCorrupt
	}
	return nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = ErrCorrupt
	}
	d.b = nil
}

func (d *decoder) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a number of elements, each of which takes at least one
// octet, so a corrupt count cannot make a huge allocation.
func (d *decoder) count() int {
	n := d.uint()
	if n > uint64(len(d.b)) {
		d.fail()
		return 0
	}
	return int(n)
}

// offset reads a non-negative octet count no larger than max.
func (d *decoder) offset(max int64) int64 {
	v := d.uint()
	if max < 0 || v > uint64(max) {
		d.fail()
		return 0
	}
	return int64(v)
}

func (d *decoder) str() string {
	v := d.uint()
	if v&1 == 0 {
		if v>>1 >= uint64(len(dict)) {
			d.fail()
			return ""
		}
		return dict[v>>1]
	}
	n := v >> 1
	if n > uint64(len(d.b)) {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) list() []Address {
	n := d.count()
	if n == 0 {
		return nil
	}
	l := make([]Address, n)
	for i := range l {
		l[i] = Address{Name: d.str(), Route: d.str(), Mailbox: d.str(), Host: d.str()}
	}
	return l
}

func (d *decoder) envelope(env *Envelope) {
	env.Date = d.str()
	env.Subject = d.str()
	env.From = d.list()
	env.Sender = d.list()
	env.ReplyTo = d.list()
	env.To = d.list()
	env.Cc = d.list()
	env.Bcc = d.list()
	env.InReplyTo = d.str()
	env.MessageID = d.str()
}

func (d *decoder) params() []Param {
	n := d.count()
	if n == 0 {
		return nil
	}
	ps := make([]Param, n)
	for i := range ps {
		ps[i] = Param{Name: d.str(), Value: d.str()}
	}
	return ps
}

// part decodes a part that lies within [base, limit).
func (d *decoder) part(base, limit int64, depth int) *Part {
	p := &Part{}
	if depth > 2*MaxDepth+2 {
		d.fail()
		return p
	}
	bits := d.uint()
	p.HeaderStart = base + d.offset(limit-base)
	p.BodyStart = p.HeaderStart + d.offset(limit-p.HeaderStart)
	p.End = p.BodyStart + d.offset(limit-p.BodyStart)
	p.Lines = d.offset(p.End - p.BodyStart)
	p.Type = d.str()
	p.Subtype = d.str()
	p.Params = d.params()
	p.defaultType = bits&pbDefaultType != 0
	for _, o := range [...]struct {
		bit uint64
		s   *string
	}{{pbID, &p.ID}, {pbDescription, &p.Description}, {pbEncoding, &p.Encoding}, {pbMD5, &p.MD5}, {pbLocation, &p.Location}} {
		if bits&o.bit != 0 {
			*o.s = d.str()
		}
	}
	if bits&pbDisposition != 0 {
		p.Disposition = d.str()
		p.DispositionParams = d.params()
	}
	if bits&pbLanguage != 0 {
		n := d.count()
		p.Language = make([]string, n)
		for i := range p.Language {
			p.Language[i] = d.str()
		}
	}
	if (p.Type == "multipart") != (bits&pbMultipart != 0) || (bits&pbMultipart != 0 && bits&pbMessage != 0) {
		d.fail()
		return p
	}
	if bits&pbMultipart != 0 {
		n := d.count()
		if n > 0 {
			p.Children = make([]*Part, 0, n)
		}
		next := p.BodyStart
		for range n {
			if d.err != nil {
				return p
			}
			c := d.part(next, p.End, depth+1)
			p.Children = append(p.Children, c)
			next = c.End
		}
	}
	if bits&pbMessage != 0 {
		p.Envelope = &Envelope{}
		d.envelope(p.Envelope)
		p.Message = d.part(p.BodyStart, p.End, depth+1)
		if p.Message.HeaderStart != p.BodyStart {
			d.fail()
		}
	}
	return p
}
