package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"quill/internal/admin"
	"quill/internal/cluster/credentials"
	"quill/internal/server"
)

func clusterCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError("cluster: init, status or drain")
	}
	switch args[0] {
	case "init":
		return clusterInit(args[1:], stdout, stderr)
	case "status":
		return clusterStatus(args[1:], stdout, stderr)
	case "drain":
		return clusterDrain(args[1:], stdout, stderr)
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
	// On Cassandra a cluster needs the batch mode: claimed before any
	// credentials exist, so an ordered keyspace gets none (ADR 0031).
	msg, err := server.ClaimClusterMode(ctx, st, cfg.Store.Cassandra.Keyspace)
	if err != nil {
		return err
	}
	if msg != "" {
		fmt.Fprintln(stdout, msg)
	}
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

// serverClient returns the admin client of the running server the flags
// point at; the cluster commands need one.
func serverClient(t target) (*admin.Client, error) {
	cfg, err := adminConfig(*t.config, *t.data)
	if err != nil {
		return nil, err
	}
	c, err := t.client(cfg)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("no running server found (%s in %s); give --admin-addr and --admin-token-file",
			server.AdminAddrFile, cfg.DataDir)
	}
	return c, nil
}

// clusterStatus prints every node the server knows of: a table, or with
// --json the API's object (nodes with id, addr, state, buckets, load;
// buckets the total).
func clusterStatus(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cluster status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	t := addTargetFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object")
	if rest, err := parse(fs, args); err != nil {
		return err
	} else if len(rest) > 0 {
		return usageError(fmt.Sprintf("cluster status: unexpected arguments %q", rest))
	}
	c, err := serverClient(t)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := c.ClusterStatus(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		b, err := json.Marshal(st)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", b)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tSTATE\tBUCKETS\tEPOCH\tLEASE\tSESSIONS\tCPU\t")
	sum := 0
	for _, n := range st.Nodes {
		sum += n.Buckets
		id := n.ID
		if id == st.Self {
			id += " (this)"
		}
		sessions, cpu := "-", "-"
		if n.Load != nil {
			sessions, cpu = strconv.Itoa(n.Load.Sessions), fmt.Sprintf("%.1f%%", 100*n.Load.CPU)
			if n.Load.Overloaded {
				cpu += " OVERLOADED"
			}
		} else if n.Error != "" {
			cpu = "(" + n.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t\n", id, n.Addr, n.State, n.Buckets, n.Epoch, n.Lease, sessions, cpu)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d nodes; %d of %d buckets assigned; map epoch %d\n", len(st.Nodes), sum, st.Buckets, st.Epoch)
	for _, n := range st.Nodes {
		if n.Managed != nil {
			fmt.Fprintf(stdout, "this node manages %d buckets at epoch %d\n", *n.Managed, n.Epoch)
		}
	}
	return nil
}

// clusterDrain marks a node draining (or, with --undo, back in service)
// through any running node.
func clusterDrain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cluster drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	t := addTargetFlags(fs)
	undo := fs.Bool("undo", false, "return the node to service")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usageError("usage: quill cluster drain NODE-ID [--undo]")
	}
	c, err := serverClient(t)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Drain(ctx, rest[0], !*undo)
	if err != nil {
		return err
	}
	if *undo {
		fmt.Fprintf(stdout, "node %s is %s: the user map gives it buckets again\n", r.Node, r.State)
	} else {
		fmt.Fprintf(stdout, "node %s is %s: the user map gives its buckets to the other nodes\n", r.Node, r.State)
	}
	return nil
}
