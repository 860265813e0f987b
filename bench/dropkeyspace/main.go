// Command dropkeyspace drops Cassandra keyspaces that a benchmark created
// (scripts/bench-cluster-scaling drops each run's keyspace after it, so
// that the schema a long invocation leaves does not slow the later runs).
//
//	go run ./bench/dropkeyspace --hosts 127.0.0.1:9042[,...] KEYSPACE...
//
// Only names of benchmark keyspaces (bench_...) are accepted.
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

var benchKeyspace = regexp.MustCompile(`^bench_[a-z0-9_]+$`)

func main() {
	hosts := flag.String("hosts", "", "Cassandra contact points, host:port[,host:port...]")
	flag.Parse()
	if *hosts == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: dropkeyspace --hosts HOST:PORT[,...] KEYSPACE...")
		os.Exit(2)
	}
	for _, ks := range flag.Args() {
		if !benchKeyspace.MatchString(ks) {
			fmt.Fprintf(os.Stderr, "dropkeyspace: %q is not a benchmark keyspace (bench_...)\n", ks)
			os.Exit(2)
		}
	}
	c := gocql.NewCluster(strings.Split(*hosts, ",")...)
	// A schema change on a loaded node takes longer than a request.
	c.Timeout = time.Minute
	s, err := c.CreateSession()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dropkeyspace: %v\n", err)
		os.Exit(1)
	}
	defer s.Close()
	for _, ks := range flag.Args() {
		if err := s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec(); err != nil {
			fmt.Fprintf(os.Stderr, "dropkeyspace: %s: %v\n", ks, err)
			os.Exit(1)
		}
	}
}
