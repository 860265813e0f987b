package mime

import (
	"strconv"
	"strings"
)

// The IMAP renderings of RFC 3501 section 7.4.2 and RFC 9051 section
// 7.5.2. Every function appends to dst and returns it, so that a FETCH
// response is built in one buffer.

// maxQuoted bounds the strings sent quoted; longer ones are literals.
const maxQuoted = 1024

// appendString appends s as an IMAP string: quoted when it is short
// 7-bit text without CR or LF, otherwise a literal. A literal is valid in
// IMAP4rev1 and IMAP4rev2 alike, whatever the client enabled. NULs, which
// no IMAP string may carry, are dropped (the parser never keeps them).
func appendString(dst []byte, s string) []byte {
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	if len(s) <= maxQuoted {
		quotable := true
		for i := 0; i < len(s); i++ {
			if c := s[i]; c == '\r' || c == '\n' || c >= 0x80 {
				quotable = false
				break
			}
		}
		if quotable {
			dst = append(dst, '"')
			for i := 0; i < len(s); i++ {
				if c := s[i]; c == '"' || c == '\\' {
					dst = append(dst, '\\')
				}
				dst = append(dst, s[i])
			}
			return append(dst, '"')
		}
	}
	dst = append(dst, '{')
	dst = strconv.AppendInt(dst, int64(len(s)), 10)
	dst = append(dst, "}\r\n"...)
	return append(dst, s...)
}

// appendNString appends s as an nstring; "" is NIL.
func appendNString(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "NIL"...)
	}
	return appendString(dst, s)
}

// AppendEnvelope appends the message's ENVELOPE (without the "ENVELOPE "
// item name).
func (s *Summary) AppendEnvelope(dst []byte) []byte {
	return appendEnvelope(dst, &s.Envelope)
}

func appendEnvelope(dst []byte, e *Envelope) []byte {
	dst = append(dst, '(')
	dst = appendNString(dst, e.Date)
	dst = append(dst, ' ')
	dst = appendNString(dst, e.Subject)
	dst = append(dst, ' ')
	dst = appendAddresses(dst, e.From)
	// RFC 3501 section 7.4.2: absent or empty Sender and Reply-To are
	// given the value of From.
	for _, l := range [][]Address{e.Sender, e.ReplyTo} {
		if len(l) == 0 {
			l = e.From
		}
		dst = append(dst, ' ')
		dst = appendAddresses(dst, l)
	}
	for _, l := range [][]Address{e.To, e.Cc, e.Bcc} {
		dst = append(dst, ' ')
		dst = appendAddresses(dst, l)
	}
	dst = append(dst, ' ')
	dst = appendNString(dst, e.InReplyTo)
	dst = append(dst, ' ')
	dst = appendNString(dst, e.MessageID)
	return append(dst, ')')
}

func appendAddresses(dst []byte, l []Address) []byte {
	if len(l) == 0 {
		return append(dst, "NIL"...)
	}
	dst = append(dst, '(')
	for _, a := range l {
		dst = append(dst, '(')
		dst = appendNString(dst, a.Name)
		dst = append(dst, ' ')
		dst = appendNString(dst, a.Route)
		dst = append(dst, ' ')
		dst = appendNString(dst, a.Mailbox)
		dst = append(dst, ' ')
		dst = appendNString(dst, a.Host)
		dst = append(dst, ')')
	}
	return append(dst, ')')
}

// AppendBodyStructure appends the message's BODYSTRUCTURE (extended true)
// or BODY (extended false), without the item name.
func (s *Summary) AppendBodyStructure(dst []byte, extended bool) []byte {
	if s.Root == nil {
		return appendBody(dst, &emptyPart, extended)
	}
	return appendBody(dst, s.Root, extended)
}

// emptyPart stands in for the missing part of a multipart without any, as
// IMAP requires at least one (Dovecot does the same). It is never modified.
var emptyPart = Part{Type: "text", Subtype: "plain", defaultType: true}

// AppendBodyStructure appends the BODYSTRUCTURE (extended true) or BODY
// of one part, as for FETCH BODYSTRUCTURE of an encapsulated message.
func (p *Part) AppendBodyStructure(dst []byte, extended bool) []byte {
	return appendBody(dst, p, extended)
}

func appendBody(dst []byte, p *Part, extended bool) []byte {
	dst = append(dst, '(')
	if p.IsMultipart() {
		if len(p.Children) == 0 {
			dst = appendBody(dst, &emptyPart, extended)
		}
		for _, c := range p.Children {
			dst = appendBody(dst, c, extended)
		}
		dst = append(dst, ' ')
		dst = appendString(dst, p.Subtype)
		if extended {
			dst = append(dst, ' ')
			dst = appendParams(dst, p.Params)
			dst = appendExtension(dst, p)
		}
		return append(dst, ')')
	}
	dst = appendString(dst, p.Type)
	dst = append(dst, ' ')
	dst = appendString(dst, p.Subtype)
	dst = append(dst, ' ')
	if p.defaultType && len(p.Params) == 0 {
		dst = append(dst, `("charset" "us-ascii")`...)
	} else {
		dst = appendParams(dst, p.Params)
	}
	dst = append(dst, ' ')
	dst = appendNString(dst, p.ID)
	dst = append(dst, ' ')
	dst = appendNString(dst, p.Description)
	dst = append(dst, ' ')
	if p.Encoding == "" {
		dst = append(dst, `"7bit"`...)
	} else {
		dst = appendString(dst, p.Encoding)
	}
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, p.End-p.BodyStart, 10)
	switch {
	case p.Message != nil:
		env := p.Envelope
		if env == nil {
			env = &Envelope{}
		}
		dst = append(dst, ' ')
		dst = appendEnvelope(dst, env)
		dst = append(dst, ' ')
		dst = appendBody(dst, p.Message, extended)
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, p.Lines, 10)
	case p.Type == "text":
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, p.Lines, 10)
	}
	if extended {
		dst = append(dst, ' ')
		dst = appendNString(dst, p.MD5)
		dst = appendExtension(dst, p)
	}
	return append(dst, ')')
}

// appendExtension appends " disposition language location", the extension
// data that single parts and multiparts share.
func appendExtension(dst []byte, p *Part) []byte {
	dst = append(dst, ' ')
	if p.Disposition == "" {
		dst = append(dst, "NIL"...)
	} else {
		dst = append(dst, '(')
		dst = appendString(dst, p.Disposition)
		dst = append(dst, ' ')
		dst = appendParams(dst, p.DispositionParams)
		dst = append(dst, ')')
	}
	dst = append(dst, ' ')
	switch len(p.Language) {
	case 0:
		dst = append(dst, "NIL"...)
	case 1:
		dst = appendString(dst, p.Language[0])
	default:
		dst = append(dst, '(')
		for i, l := range p.Language {
			if i > 0 {
				dst = append(dst, ' ')
			}
			dst = appendString(dst, l)
		}
		dst = append(dst, ')')
	}
	dst = append(dst, ' ')
	return appendNString(dst, p.Location)
}

func appendParams(dst []byte, params []Param) []byte {
	if len(params) == 0 {
		return append(dst, "NIL"...)
	}
	dst = append(dst, '(')
	for i, x := range params {
		if i > 0 {
			dst = append(dst, ' ')
		}
		dst = appendString(dst, x.Name)
		dst = append(dst, ' ')
		dst = appendString(dst, x.Value)
	}
	return append(dst, ')')
}
