// Command cassinsert measures Cassandra's own rate of single-row inserts of
// a message-sized value, the yardstick of the cluster issue's target for
// one Quill node on one Cassandra node ("at least a quarter of Cassandra's
// own rate of single-row 4.7 KB inserts at the same consistency"). It
// creates the keyspace (SimpleStrategy, --rf) and one table, runs
// --concurrency writers of distinct rows at LOCAL_QUORUM (Quill's default
// write consistency) for --duration, prints one JSON object with the rows
// written per second, and drops the keyspace.
//
//	go run ./bench/cassinsert --hosts 127.0.0.1:9042 --keyspace bench_insert_1 \
//	    [--rf 1] [--size 4700] [--concurrency 32] [--duration 20s]
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

var benchKeyspace = regexp.MustCompile(`^bench_[a-z0-9_]+$`)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "cassinsert: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	hosts := flag.String("hosts", "", "Cassandra contact points, host:port[,host:port...]")
	ks := flag.String("keyspace", "", "keyspace to create and drop (bench_...)")
	rf := flag.Int("rf", 1, "replication factor")
	size := flag.Int("size", 4700, "value size in octets")
	concurrency := flag.Int("concurrency", 32, "writers")
	duration := flag.Duration("duration", 20*time.Second, "measured time")
	conns := flag.Int("conns", 1, "connections per host (Quill's default, store.cassandra.connections_per_host)")
	flag.Parse()
	if *hosts == "" || !benchKeyspace.MatchString(*ks) || *size <= 0 || *concurrency <= 0 || *duration <= 0 {
		return errors.New("usage: cassinsert --hosts HOST:PORT[,...] --keyspace bench_... [--rf N] [--size N] [--concurrency N] [--duration D]")
	}
	c := gocql.NewCluster(strings.Split(*hosts, ",")...)
	c.Timeout = time.Minute // schema changes on a loaded node
	admin, err := c.CreateSession()
	if err != nil {
		return err
	}
	defer admin.Close()
	if err := admin.Query(fmt.Sprintf(`CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': 'SimpleStrategy', 'replication_factor': %d}`, *ks, *rf)).Exec(); err != nil {
		return err
	}
	defer admin.Query("DROP KEYSPACE IF EXISTS " + *ks).Exec()
	if err := admin.Query(fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.rows (id blob PRIMARY KEY, body blob)`, *ks)).Exec(); err != nil {
		return err
	}

	c = gocql.NewCluster(strings.Split(*hosts, ",")...)
	c.Keyspace = *ks
	c.Consistency = gocql.LocalQuorum
	c.Timeout = 10 * time.Second
	c.NumConns = *conns
	s, err := c.CreateSession()
	if err != nil {
		return err
	}
	defer s.Close()
	body := make([]byte, *size)
	rand.Read(body)
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	var rows, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *concurrency {
		wg.Go(func() {
			id := make([]byte, 16)
			for ctx.Err() == nil {
				rand.Read(id)
				if err := s.Query(`INSERT INTO rows (id, body) VALUES (?, ?)`, id, body).Exec(); err != nil {
					failed.Add(1)
					continue
				}
				rows.Add(1)
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"rows": rows.Load(), "failed": failed.Load(), "seconds": secs,
		"rows_per_sec": float64(rows.Load()) / secs, "size": *size, "concurrency": *concurrency,
	})
}
