package smtp

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"quill/internal/mail"
)

// command is one parsed command line (RFC 5321 section 4.1.1).
type command struct {
	verb string // upper case; empty for an empty line
	arg  string // everything after the first space
}

// knownVerbs is the fixed metrics vocabulary (label cardinality must not be
// client-controlled).
var knownVerbs = map[string]bool{
	"HELO": true, "EHLO": true, "LHLO": true, "MAIL": true, "RCPT": true,
	"DATA": true, "BDAT": true, "RSET": true, "NOOP": true, "QUIT": true,
	"VRFY": true, "EXPN": true, "HELP": true, "STARTTLS": true, "AUTH": true,
}

func metricName(verb string) string {
	if knownVerbs[verb] {
		return verb
	}
	return "unknown"
}

// parseCommand splits a command line into verb and argument. Lines must be
// UTF-8 without control characters other than HTAB: a NUL or CR inside a
// command is either an attack or a broken client.
func parseCommand(line string) (command, error) {
	if !utf8.ValidString(line) {
		return command{}, errReply(500, "5.5.2", "Invalid UTF-8 in command")
	}
	for i := 0; i < len(line); i++ {
		if c := line[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return command{}, errReply(500, "5.5.2", "Control character in command")
		}
	}
	verb, arg, _ := strings.Cut(line, " ")
	if len(verb) > 16 {
		return command{}, errReply(500, "5.5.1", "Command not recognized")
	}
	for i := 0; i < len(verb); i++ {
		if c := verb[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
			return command{}, errReply(500, "5.5.1", "Command not recognized")
		}
	}
	return command{verb: strings.ToUpper(verb), arg: strings.TrimRight(arg, " \t")}, nil
}

// mailArgs is a parsed MAIL argument.
type mailArgs struct {
	from     mail.Address
	size     int64  // SIZE= (RFC 1870), 0 when absent
	body     string // BODY= (RFC 6152): "7BIT" or "8BITMIME"; "" when absent
	smtpUTF8 bool   // SMTPUTF8 (RFC 6531 section 3.4)
}

// parseMail parses the argument of MAIL: "FROM:<path> [params]". Parameters
// are allowed only after EHLO (esmtp).
func parseMail(arg string, esmtp bool) (mailArgs, error) {
	path, ok := cutPrefixFold(arg, "FROM:")
	if !ok {
		return mailArgs{}, errReply(501, "5.5.4", "Syntax: MAIL FROM:<address>")
	}
	from, rest, err := parsePath(path, true)
	if err != nil {
		return mailArgs{}, err
	}
	params, err := parseParams(rest, esmtp)
	if err != nil {
		return mailArgs{}, err
	}
	m := mailArgs{from: from}
	for _, p := range params {
		switch p.key {
		case "SIZE":
			n, err := strconv.ParseInt(p.value, 10, 64)
			if err != nil || n < 0 || p.value == "" || p.value[0] == '+' {
				return mailArgs{}, errReply(501, "5.5.4", "Invalid SIZE parameter")
			}
			m.size = n
		case "BODY":
			switch v := strings.ToUpper(p.value); v {
			case "7BIT", "8BITMIME":
				m.body = v
			default:
				return mailArgs{}, errReply(555, "5.5.4", "Unsupported BODY type")
			}
		case "SMTPUTF8":
			if p.hasValue {
				return mailArgs{}, errReply(501, "5.5.4", "SMTPUTF8 takes no value")
			}
			m.smtpUTF8 = true
		case "AUTH":
			// RFC 4954 section 5: the original submitter; Quill does not
			// relay, so it is accepted and ignored.
		default:
			return mailArgs{}, errReply(555, "5.5.4", "Unsupported MAIL parameter "+p.key)
		}
	}
	if !m.smtpUTF8 && !isASCII(from.Local+from.Domain) {
		return mailArgs{}, errReply(553, "5.6.7", "Non-ASCII address requires SMTPUTF8")
	}
	return m, nil
}

// parseRcpt parses the argument of RCPT: "TO:<path>". Quill offers no RCPT
// parameters (no DSN), so any is refused. "<Postmaster>" without a domain
// (RFC 5321 section 4.1.1.3) is returned with an empty Domain.
func parseRcpt(arg string, smtpUTF8 bool) (mail.Address, error) {
	path, ok := cutPrefixFold(arg, "TO:")
	if !ok {
		return mail.Address{}, errReply(501, "5.5.4", "Syntax: RCPT TO:<address>")
	}
	path = strings.TrimLeft(path, " ")
	if len(path) >= len("<postmaster>") && strings.EqualFold(path[:len("<postmaster>")], "<postmaster>") {
		if rest := path[len("<postmaster>"):]; rest != "" {
			return mail.Address{}, errReply(555, "5.5.4", "Unsupported RCPT parameter")
		}
		return mail.Address{Local: "postmaster"}, nil
	}
	rcpt, rest, err := parsePath(path, false)
	if err != nil {
		return mail.Address{}, err
	}
	if strings.TrimLeft(rest, " ") != "" {
		return mail.Address{}, errReply(555, "5.5.4", "Unsupported RCPT parameter")
	}
	if !smtpUTF8 && !isASCII(rcpt.Local+rcpt.Domain) {
		return mail.Address{}, errReply(553, "5.6.7", "Non-ASCII address requires SMTPUTF8")
	}
	return rcpt, nil
}

// parsePath parses "<path>" tolerating spaces after the colon, as many
// clients send "MAIL FROM: <a@b>". UTF-8 is accepted here; the caller
// refuses it without SMTPUTF8, whose presence is only known after the
// parameters are parsed.
func parsePath(s string, allowNull bool) (mail.Address, string, error) {
	s = strings.TrimLeft(s, " ")
	a, rest, err := mail.ParsePath(s, allowNull, true)
	if err != nil {
		return mail.Address{}, "", errReply(553, "5.1.3", "Bad address syntax")
	}
	if rest != "" && rest[0] != ' ' {
		return mail.Address{}, "", errReply(501, "5.5.4", "Syntax error after address")
	}
	return a, rest, nil
}

type param struct {
	key      string // upper case
	value    string
	hasValue bool
}

// parseParams parses " KEY[=VALUE]..." (RFC 5321 section 4.1.2
// Mail-parameters); keys are case-insensitive and may not repeat.
func parseParams(s string, esmtp bool) ([]param, error) {
	fields := strings.Fields(s)
	if len(fields) > 0 && !esmtp {
		return nil, errReply(555, "5.5.4", "Parameters require EHLO")
	}
	if len(fields) > 16 {
		return nil, errReply(501, "5.5.4", "Too many parameters")
	}
	params := make([]param, 0, len(fields))
	for _, f := range fields {
		k, v, hasValue := strings.Cut(f, "=")
		if k == "" || (hasValue && v == "") {
			return nil, errReply(501, "5.5.4", "Malformed parameter")
		}
		for i := 0; i < len(k); i++ {
			c := k[i]
			if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0) {
				return nil, errReply(501, "5.5.4", "Malformed parameter")
			}
		}
		k = strings.ToUpper(k)
		for _, p := range params {
			if p.key == k {
				return nil, errReply(501, "5.5.4", "Duplicate parameter "+k)
			}
		}
		params = append(params, param{key: k, value: v, hasValue: hasValue})
	}
	return params, nil
}

// parseBDAT parses "chunk-size [LAST]" (RFC 3030 section 2). ok is false
// when the size itself is unreadable: the client and server can then no
// longer agree where the next command starts.
func parseBDAT(arg string) (size int64, last bool, ok bool, err error) {
	fields := strings.Fields(arg)
	if len(fields) == 0 {
		// No size, so no chunk follows: the session stays in sync.
		return 0, false, true, errReply(501, "5.5.4", "Syntax: BDAT size [LAST]")
	}
	if len(fields) > 2 {
		return 0, false, false, errReply(501, "5.5.4", "Syntax: BDAT size [LAST]")
	}
	for i := 0; i < len(fields[0]); i++ {
		if c := fields[0][i]; c < '0' || c > '9' {
			return 0, false, false, errReply(501, "5.5.4", "Syntax: BDAT size [LAST]")
		}
	}
	size, perr := strconv.ParseInt(fields[0], 10, 64)
	if perr != nil {
		return 0, false, false, errReply(501, "5.5.4", "Syntax: BDAT size [LAST]")
	}
	if len(fields) == 2 {
		if !strings.EqualFold(fields[1], "LAST") {
			return size, false, true, errReply(501, "5.5.4", "Syntax: BDAT size [LAST]")
		}
		last = true
	}
	return size, last, true, nil
}

// validHelo accepts what a client may name itself: a domain or an address
// literal, loosely (RFC 5321 section 4.1.4 forbids refusing a HELO merely
// because it does not match the peer), but printable and within length so
// it can be copied into the Received field safely.
func validHelo(s string) bool {
	if s == "" || len(s) > mail.MaxDomainLen || strings.ContainsAny(s, " \t()\\\"<>;") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
