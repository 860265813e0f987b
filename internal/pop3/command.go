package pop3

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
)

// Command is one parsed POP3 command line (RFC 1939 section 3, RFC 2449
// section 3).
type Command struct {
	// Name is the keyword, upper-cased.
	Name string
	// Args are the space-separated arguments (runs of spaces are one
	// separator).
	Args []string
	// Rest is everything after the single space that follows the keyword,
	// unsplit. PASS uses it so that a password may contain spaces
	// (RFC 1939 section 7, PASS discussion).
	Rest string
}

// Parse errors. They never contain client input.
var (
	errEmptyCommand = errors.New("pop3: empty command line")
	errBadKeyword   = errors.New("pop3: malformed command keyword")
	errBadArgument  = errors.New("pop3: control character in command line")
	errTooManyArgs  = errors.New("pop3: too many arguments")
)

// maxKeyword is the longest keyword accepted. RFC 2449 section 3 allows
// keywords of three or four characters; one more costs nothing and leaves
// room for extensions.
const maxKeyword = 8

// maxArgs bounds the argument list; no POP3 command takes more than two.
const maxArgs = 4

// ParseCommand parses one command line, without or with its CRLF.
//
// RFC 2449 section 3: a keyword of printable ASCII, case-insensitive,
// followed by arguments separated by spaces. Arguments may contain any
// octet except controls, so that UTF-8 user names and passwords pass
// through; NUL, CR, LF and the other controls are rejected.
func ParseCommand(line []byte) (Command, error) {
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		return Command{}, errEmptyCommand
	}
	for _, b := range line {
		if b < 0x20 || b == 0x7f {
			return Command{}, errBadArgument
		}
	}
	kw, rest, hasRest := bytes.Cut(line, []byte(" "))
	if len(kw) == 0 || len(kw) > maxKeyword {
		return Command{}, errBadKeyword
	}
	for _, b := range kw {
		if !(b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-') {
			return Command{}, errBadKeyword
		}
	}
	cmd := Command{Name: keyword(kw)}
	if !hasRest {
		return cmd, nil
	}
	cmd.Rest = string(rest)
	for rest := cmd.Rest; rest != ""; {
		var f string
		f, rest, _ = strings.Cut(rest, " ")
		if f == "" {
			continue
		}
		if len(cmd.Args) == maxArgs {
			return Command{}, errTooManyArgs
		}
		cmd.Args = append(cmd.Args, f)
	}
	return cmd, nil
}

// keyword returns kw, a valid keyword, upper-cased. The commands this
// server knows come back as constants: no allocation for the keyword of
// every command of every session.
func keyword(kw []byte) string {
	var b [maxKeyword]byte
	up := b[:len(kw)]
	for i, c := range kw {
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		up[i] = c
	}
	switch string(up) {
	case "USER":
		return "USER"
	case "PASS":
		return "PASS"
	case "STAT":
		return "STAT"
	case "RETR":
		return "RETR"
	case "DELE":
		return "DELE"
	case "QUIT":
		return "QUIT"
	case "CAPA":
		return "CAPA"
	case "LIST":
		return "LIST"
	case "UIDL":
		return "UIDL"
	}
	return string(up)
}

// parseDecimal parses a non-negative decimal number of at most 18 digits,
// so that it always fits an int on 64-bit platforms.
func parseDecimal(s string) (int, bool) {
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}
