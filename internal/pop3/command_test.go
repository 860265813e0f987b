package pop3

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseCommand(t *testing.T) {
	tests := []struct {
		line string
		want Command
		err  error
	}{
		{"QUIT\r\n", Command{Name: "QUIT"}, nil},
		{"quit", Command{Name: "QUIT"}, nil},
		{"LIST 1", Command{Name: "LIST", Args: []string{"1"}, Rest: "1"}, nil},
		{"top 1 10\r\n", Command{Name: "TOP", Args: []string{"1", "10"}, Rest: "1 10"}, nil},
		{"PASS secret with  spaces ", Command{Name: "PASS", Args: []string{"secret", "with", "spaces"}, Rest: "secret with  spaces "}, nil},
		{"USER jörg@example.org", Command{Name: "USER", Args: []string{"jörg@example.org"}, Rest: "jörg@example.org"}, nil},
		{"NOOP ", Command{Name: "NOOP", Rest: ""}, nil},
		{"X-EXT a", Command{Name: "X-EXT", Args: []string{"a"}, Rest: "a"}, nil},
		{"", Command{}, errEmptyCommand},
		{"\r\n", Command{}, errEmptyCommand},
		{" LIST", Command{}, errBadKeyword},
		{"LISTLISTLIST", Command{}, errBadKeyword},
		{"LI*T", Command{}, errBadKeyword},
		{"LIST\t1", Command{}, errBadArgument},
		{"PASS a\x00b", Command{}, errBadArgument},
		{"USER a\rb", Command{}, errBadArgument},
		{"TOP 1 2 3 4 5", Command{}, errTooManyArgs},
	}
	for _, tt := range tests {
		got, err := ParseCommand([]byte(tt.line))
		if err != tt.err {
			t.Errorf("ParseCommand(%q) error = %v, want %v", tt.line, err, tt.err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseCommand(%q) = %#v, want %#v", tt.line, got, tt.want)
		}
	}
}

func TestParseDecimal(t *testing.T) {
	for s, want := range map[string]int{"0": 0, "1": 1, "42": 42, "007": 7, "999999999999999999": 999999999999999999} {
		if n, ok := parseDecimal(s); !ok || n != want {
			t.Errorf("parseDecimal(%q) = %d, %v; want %d", s, n, ok, want)
		}
	}
	for _, s := range []string{"", "-1", "+1", "1a", " 1", "0x10", "1000000000000000000"} {
		if n, ok := parseDecimal(s); ok {
			t.Errorf("parseDecimal(%q) = %d, accepted", s, n)
		}
	}
}

// FuzzParseCommand checks that the parser never panics and that what it
// accepts is well formed and survives a round trip.
func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{
		"USER alice", "PASS pa ss word", "STAT", "LIST", "LIST 1", "UIDL 2", "TOP 1 0",
		"RETR 1", "DELE 1", "RSET", "NOOP", "QUIT", "CAPA", "STLS", "AUTH PLAIN AGFsaWNlAHNlY3JldA==",
		"AUTH LOGIN", "AUTH", "list  1", "\r\n", "", "X\x00", "LIST\t1", "APOP a b", "TOP 1 2 3 4 5",
		"USER \xff\xfe", "NOOP\u00a0x",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		cmd, err := ParseCommand(line)
		if err != nil {
			return
		}
		kw, _, _ := strings.Cut(strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r"), " ")
		if cmd.Name == "" || len(cmd.Name) > maxKeyword || cmd.Name != strings.ToUpper(kw) {
			t.Fatalf("bad keyword %q from %q", cmd.Name, line)
		}
		if len(cmd.Args) > maxArgs {
			t.Fatalf("%d args from %q", len(cmd.Args), line)
		}
		for _, a := range cmd.Args {
			if a == "" || strings.ContainsAny(a, " \r\n\x00") {
				t.Fatalf("bad argument %q from %q", a, line)
			}
		}
		again, err := ParseCommand([]byte(cmd.Name + " " + strings.Join(cmd.Args, " ")))
		if err != nil || again.Name != cmd.Name || !reflect.DeepEqual(again.Args, cmd.Args) {
			t.Fatalf("round trip of %q: %#v, %v", line, again, err)
		}
	})
}
