package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"quill/internal/cluster/credentials"
)

func clusterCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError("cluster: init, status or drain")
	}
	switch args[0] {
	case "init":
		return clusterInit(args[1:], stdout, stderr)
	default:
		return usageError(fmt.Sprintf("cluster: unknown sub-command %q (init, status, drain)", args[0]))
	}
}

// clusterInit creates the cluster's credentials in the store the
// configuration names, once: a second run reports them and changes
// nothing. It opens the store directly, so with the embedded engine no
// server may run on the data directory; a Cassandra keyspace is shared.
func clusterInit(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cluster init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", "", "TOML configuration file: its data_dir and [store]")
	data := fs.String("data", "", "data directory (default: the configuration's data_dir, ./quill-data)")
	if rest, err := parse(fs, args); err != nil {
		return err
	} else if len(rest) > 0 {
		return usageError(fmt.Sprintf("cluster init: unexpected arguments %q", rest))
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, created, err := credentials.Init(ctx, st, time.Now())
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stdout, "cluster credentials created in the store (CA %s)\n", rec.Fingerprint())
	} else {
		fmt.Fprintf(stdout, "cluster credentials exist already in the store (CA %s, created %s); nothing changed\n",
			rec.Fingerprint(), rec.Created.Format(time.RFC3339))
	}
	return nil
}
