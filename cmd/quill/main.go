// Command quill is the Quill mail server: `quill serve` runs a node; the
// other sub-commands administer users and aliases and check the store.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage: quill <command> [arguments]

commands:
  serve                      run a node (see quill serve -h)
  user add ADDRESS [--quota BYTES]   create a user; password on stdin
  user del ADDRESS           delete a user and all its mail
  user passwd ADDRESS        set a user's password; password on stdin
  user list                  list users
  alias add ALIAS TARGET     make ALIAS deliver to user TARGET
  alias del ALIAS            remove an alias
  alias list                 list aliases
  check                      verify the store's consistency (server stopped)
  cluster init               create the cluster's credentials in the store, once
  cluster status [--json]    list the cluster's nodes: state, buckets, load
  cluster drain NODE-ID [--undo]   move a node's buckets to the others (or back)
  version                    print the version

user, alias, check and cluster take --data DIR (default ./quill-data) and, for a
Cassandra store, --config FILE; user and alias also take --admin-addr
HOST:PORT with --admin-token-file FILE to act through a running server
(cluster status and drain always do).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(args[1:], stdout, stderr)
	case "user":
		err = userCmd(args[1:], stdin, stdout, stderr)
	case "alias":
		err = aliasCmd(args[1:], stdout, stderr)
	case "check":
		err = checkCmd(args[1:], stdout, stderr)
	case "cluster":
		err = clusterCmd(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "quill", versionString())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "quill: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "quill:", err)
		if _, ok := err.(usageError); ok {
			return 2
		}
		return 1
	}
	return 0
}

type usageError string

func (e usageError) Error() string { return string(e) }

func versionString() string {
	v := version
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
	}
	return v
}

// parse parses flags that may appear before, between or after positional
// arguments ("user add ADDR --data DIR"), which flag.Parse alone does not.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // fs.Parse reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	if err := fs.Parse(flags); err != nil {
		return nil, err
	}
	return positional, nil
}
