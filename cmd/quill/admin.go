package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

	"quill/internal/admin"
	"quill/internal/auth"
	"quill/internal/cluster/credentials"
	"quill/internal/config"
	"quill/internal/server"
	"quill/internal/store"
)

// target says where user and alias commands act.
type target struct {
	config, data, adminAddr, tokenFile *string
}

func addTargetFlags(fs *flag.FlagSet) target {
	return target{
		config:    fs.String("config", "", "TOML configuration file: its data_dir and [store] (optional)"),
		data:      fs.String("data", "", "data directory (default: the configuration's data_dir, ./quill-data)"),
		adminAddr: fs.String("admin-addr", "", "admin API of a running server (host:port)"),
		tokenFile: fs.String("admin-token-file", "", "file holding the admin API token (default DATA/"+server.AdminTokenFile+")"),
	}
}

// open returns the directory to act on: the admin API of a running server
// (named by --admin-addr, or found through DATA/admin.addr), else the store
// the configuration names opened directly (see openStore).
func (t target) open(stderr io.Writer) (admin.Directory, func(), error) {
	cfg, err := adminConfig(*t.config, *t.data)
	if err != nil {
		return nil, nil, err
	}
	c, err := t.client(cfg)
	if err != nil {
		return nil, nil, err
	}
	if c != nil {
		return c, func() {}, nil
	}
	st, err := openStore(cfg, stderr)
	if err != nil {
		return nil, nil, err
	}
	return &auth.Directory{Store: st}, func() { st.Close() }, nil
}

// client returns a client of the admin API of a running server: the one
// --admin-addr names, or the one DATA/admin.addr names if it answers; nil
// when there is none.
func (t target) client(cfg config.Config) (*admin.Client, error) {
	addr := *t.adminAddr
	if addr == "" {
		if b, err := os.ReadFile(filepath.Join(cfg.DataDir, server.AdminAddrFile)); err == nil {
			candidate := strings.TrimSpace(string(b))
			if c, err := net.DialTimeout("tcp", candidate, 2*time.Second); err == nil {
				c.Close()
				addr = candidate
			}
			// Otherwise the file is left by a server that died: the store
			// is free to open directly.
		}
	}
	if addr == "" {
		return nil, nil
	}
	tokenFile := *t.tokenFile
	if tokenFile == "" {
		tokenFile = filepath.Join(cfg.DataDir, server.AdminTokenFile)
	}
	token := os.Getenv("QUILL_ADMIN_TOKEN")
	if token == "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("admin token: %w (set --admin-token-file or QUILL_ADMIN_TOKEN)", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return &admin.Client{Addr: addr, Token: token}, nil
}

// adminConfig is the configuration the admin commands act on: the file
// (or the defaults), with data overriding its data_dir when not "".
func adminConfig(file, data string) (config.Config, error) {
	cfg := config.Default()
	if file != "" {
		var err error
		if cfg, err = config.Load(file); err != nil {
			return config.Config{}, err
		}
	}
	if data != "" {
		cfg.DataDir = data
	}
	return cfg, nil
}

// adminStore is what the admin commands need of a storage engine.
type adminStore interface {
	auth.DirectoryStore
	credentials.Secrets
	Check(ctx context.Context) ([]string, error)
	Close() error
}

// openStore opens the engine cfg names, exactly as quill serve does
// (server.OpenStore). The embedded engine admits one process: it fails
// while a server holds the data directory. The Cassandra engine is shared
// by any number of processes, so it opens whether or not servers run.
func openStore(cfg config.Config, stderr io.Writer) (adminStore, error) {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if cfg.Store.Engine == "cassandra" {
		st, err := server.OpenStore(cfg, log, nil)
		if err != nil {
			return nil, fmt.Errorf("opening cassandra keyspace %s: %w", cfg.Store.Cassandra.Keyspace, err)
		}
		return asAdminStore(st)
	}
	if _, err := os.Stat(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	st, err := server.OpenStore(cfg, log, nil)
	if err != nil {
		return nil, fmt.Errorf("%w (is a server running on %s without an admin listener?)", err, cfg.DataDir)
	}
	return asAdminStore(st)
}

// asAdminStore checks that an engine offers what the admin commands need
// (both engines do), closing it otherwise.
func asAdminStore(st store.Engine) (adminStore, error) {
	as, ok := st.(adminStore)
	if !ok {
		st.Close()
		return nil, fmt.Errorf("store engine %T lacks secrets or checks", st)
	}
	return as, nil
}

// readPassword reads one line from stdin; on a terminal it prompts and
// does not echo what is typed.
func readPassword(stdin io.Reader, stderr io.Writer) (string, error) {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(stderr, "Password: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		if err != nil {
			return "", fmt.Errorf("reading password: %w", err)
		}
		return string(b), nil
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		return "", fmt.Errorf("reading password from standard input: %w", err)
	}
	return strings.TrimRight(line, "\r\n"), nil
}

func userCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("user", flag.ContinueOnError)
	fs.SetOutput(stderr)
	t := addTargetFlags(fs)
	quota := fs.Int64("quota", 0, "quota in bytes (0: unlimited)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError("user: add, del, passwd or list")
	}
	need := map[string]int{"add": 2, "del": 2, "passwd": 2, "list": 1}[pos[0]]
	if need == 0 || len(pos) != need {
		return usageError("usage: quill user add|del|passwd ADDRESS | quill user list")
	}
	d, done, err := t.open(stderr)
	if err != nil {
		return err
	}
	defer done()
	ctx := context.Background()
	switch pos[0] {
	case "add":
		pw, err := readPassword(stdin, stderr)
		if err != nil {
			return err
		}
		return d.AddUser(ctx, pos[1], pw, *quota)
	case "passwd":
		pw, err := readPassword(stdin, stderr)
		if err != nil {
			return err
		}
		return d.SetPassword(ctx, pos[1], pw)
	case "del":
		return d.DeleteUser(ctx, pos[1])
	default:
		users, err := d.ListUsers(ctx)
		if err != nil {
			return err
		}
		for _, u := range users {
			line := u.Address
			if u.QuotaBytes > 0 {
				line += "\tquota=" + strconv.FormatInt(u.QuotaBytes, 10)
			}
			fmt.Fprintln(stdout, line)
		}
		return nil
	}
}

func aliasCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("alias", flag.ContinueOnError)
	fs.SetOutput(stderr)
	t := addTargetFlags(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError("alias: add, del or list")
	}
	need := map[string]int{"add": 3, "del": 2, "list": 1}[pos[0]]
	if need == 0 || len(pos) != need {
		return usageError("usage: quill alias add ALIAS TARGET | quill alias del ALIAS | quill alias list")
	}
	d, done, err := t.open(stderr)
	if err != nil {
		return err
	}
	defer done()
	ctx := context.Background()
	switch pos[0] {
	case "add":
		return d.AddAlias(ctx, pos[1], pos[2])
	case "del":
		return d.DeleteAlias(ctx, pos[1])
	default:
		list, err := d.ListAliases(ctx)
		if err != nil {
			return err
		}
		for _, a := range list {
			fmt.Fprintf(stdout, "%s\t%s\n", a[0], a[1])
		}
		return nil
	}
}

func checkCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", "", "TOML configuration file: its data_dir and [store] (optional)")
	data := fs.String("data", "", "data directory (default: the configuration's data_dir, ./quill-data)")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := adminConfig(*configFile, *data)
	if err != nil {
		return err
	}
	st, err := openStore(cfg, stderr)
	if err != nil {
		return err
	}
	defer st.Close()
	problems, err := st.Check(context.Background())
	if err != nil {
		return err
	}
	for _, p := range problems {
		fmt.Fprintln(stdout, p)
	}
	if len(problems) > 0 {
		return fmt.Errorf("store: %d problems", len(problems))
	}
	fmt.Fprintln(stdout, "store consistent")
	return nil
}
