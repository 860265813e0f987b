// Command cassinsert measures Cassandra's own rate of single-row inserts of
// a message-sized value, the yardstick of the cluster issue's target for
// one Quill node on one Cassandra node ("at least a quarter of Cassandra's
// own rate of single-row 4.7 KB inserts at the same consistency"). It
// creates the keyspace (SimpleStrategy, --rf) and one table, runs
// --concurrency writers of distinct rows at LOCAL_QUORUM (Quill's default
// write consistency) for --duration, prints one JSON object with the rows
// (with --pattern, the operations) written per second, and drops the
// keyspace.
//
// --pattern names what one operation writes instead of one row: the
// writes of one delivery in the batch mode's data model (ADR 0026) and in
// the alternatives its amendment measured, with the same columns as the
// engine's tables (300 octets stand for the message's summary), no
// Quill code in between. "row" (the default) is the yardstick; "batch"
// is today's delivery: the blob row alongside one unlogged batch of the
// message row and its change log entry, then the head; "no-change" the
// same without the change log entry; "head-in-partition" the blob row,
// then the message row with the head as static columns of its partition
// (one mutation); "body-in-row" that row with the body in it as well.
// Each writer delivers into a mailbox of its own.
//
//	go run ./bench/cassinsert --hosts 127.0.0.1:9042 --keyspace bench_insert_1 \
//	    [--rf 1] [--size 4700] [--concurrency 32] [--duration 20s] [--pattern row]
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
	pattern := flag.String("pattern", "row", "what one operation writes: row, batch, no-change, head-in-partition, body-in-row")
	flag.Parse()
	if *hosts == "" || !benchKeyspace.MatchString(*ks) || *size <= 0 || *concurrency <= 0 || *duration <= 0 || patterns[*pattern] == nil {
		return errors.New("usage: cassinsert --hosts HOST:PORT[,...] --keyspace bench_... [--rf N] [--size N] [--concurrency N] [--duration D] [--pattern row|batch|no-change|head-in-partition|body-in-row]")
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
	for _, t := range tables {
		if err := admin.Query(fmt.Sprintf(t, *ks)).Exec(); err != nil {
			return err
		}
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
	write := patterns[*pattern]
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	var rows, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *concurrency {
		wg.Go(func() {
			w := &writer{s: s, body: body, mailbox: make([]byte, 16)}
			rand.Read(w.mailbox)
			for ctx.Err() == nil {
				w.uid++
				if err := write(w); err != nil {
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
		"rows_per_sec": float64(rows.Load()) / secs, "size": *size, "concurrency": *concurrency, "pattern": *pattern,
	})
}

// tables are the yardstick's and the batch mode's, as the engine's schema
// declares them (internal/store/cassandra/schema.go), with the static head
// columns the alternatives need.
var tables = []string{
	`CREATE TABLE IF NOT EXISTS %s.rows (id blob PRIMARY KEY, body blob)`,
	`CREATE TABLE IF NOT EXISTS %s.blobs (id blob PRIMARY KEY, size bigint, chunks int, created timestamp, data blob, owner blob, owner_uid bigint)`,
	`CREATE TABLE IF NOT EXISTS %s.bmessages (mailbox blob, bucket int, uid bigint, modseq bigint,
		kind tinyint, added bigint, flags text, internal_date timestamp, size bigint, blob blob, meta blob, data blob,
		h_uidnext bigint static, h_modseq bigint static, h_messages bigint static, h_size bigint static,
		PRIMARY KEY ((mailbox, bucket), uid, modseq))`,
	`CREATE TABLE IF NOT EXISTS %s.bchanges (mailbox blob, bucket int, section tinyint, modseq bigint, uid bigint,
		kind tinyint, flags text, PRIMARY KEY ((mailbox, bucket), section, modseq, uid))`,
	`CREATE TABLE IF NOT EXISTS %s.bmailboxes (id blob PRIMARY KEY,
		address text, name text, special_use text, subscribed boolean, uidvalidity bigint,
		epoch bigint, uidnext bigint, modseq bigint, messages bigint, size bigint, expunge_floor bigint)`,
}

// writer is one writer's state: its mailbox and the UID it delivers.
type writer struct {
	s       *gocql.Session
	body    []byte
	mailbox []byte
	uid     int64
}

// meta stands for a message's summary (its envelope and structure).
var meta = make([]byte, 300)

const flags = `\Seen`

const insertMessage = `INSERT INTO bmessages (mailbox, bucket, uid, modseq, kind, added, flags, internal_date, size, blob, meta) VALUES (?, 0, ?, 0, 0, ?, ?, ?, ?, ?, ?)`

func (w *writer) blob(id []byte) error {
	return w.s.Query(`INSERT INTO blobs (id, size, chunks, data, created, owner, owner_uid) VALUES (?, ?, 0, ?, ?, ?, ?)`,
		id, len(w.body), w.body, time.Now(), w.mailbox, w.uid).Exec()
}

func (w *writer) head() error {
	return w.s.Query(`UPDATE bmailboxes SET epoch = 1, uidnext = ?, modseq = ?, messages = ?, size = ? WHERE id = ?`,
		w.uid+1, w.uid, w.uid, w.uid*int64(len(w.body)), w.mailbox).Exec()
}

// alongside runs a and b at once, as the engine sends a batch's blob rows
// and its other rows.
func alongside(a, b func() error) error {
	ch := make(chan error, 1)
	go func() { ch <- a() }()
	return errors.Join(b(), <-ch)
}

func newID() []byte {
	id := make([]byte, 16)
	rand.Read(id)
	return id
}

var patterns = map[string]func(w *writer) error{
	"row": func(w *writer) error {
		return w.s.Query(`INSERT INTO rows (id, body) VALUES (?, ?)`, newID(), w.body).Exec()
	},
	"batch": func(w *writer) error {
		id := newID()
		err := alongside(func() error { return w.blob(id) }, func() error {
			b := w.s.Batch(gocql.UnloggedBatch)
			b.Query(insertMessage, w.mailbox, w.uid, w.uid, flags, time.Now(), len(w.body), id, meta)
			b.Query(`INSERT INTO bchanges (mailbox, bucket, section, modseq, uid, kind, flags) VALUES (?, 0, 0, ?, ?, 0, ?)`, w.mailbox, w.uid, w.uid, flags)
			return w.s.ExecuteBatch(b)
		})
		if err != nil {
			return err
		}
		return w.head()
	},
	"no-change": func(w *writer) error {
		id := newID()
		err := alongside(func() error { return w.blob(id) }, func() error {
			return w.s.Query(insertMessage, w.mailbox, w.uid, w.uid, flags, time.Now(), len(w.body), id, meta).Exec()
		})
		if err != nil {
			return err
		}
		return w.head()
	},
	"head-in-partition": func(w *writer) error {
		id := newID()
		if err := w.blob(id); err != nil {
			return err
		}
		return w.s.Query(`INSERT INTO bmessages (mailbox, bucket, uid, modseq, kind, added, flags, internal_date, size, blob, meta, h_uidnext, h_modseq, h_messages, h_size)
			VALUES (?, 0, ?, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			w.mailbox, w.uid, w.uid, flags, time.Now(), len(w.body), id, meta, w.uid+1, w.uid, w.uid, w.uid*int64(len(w.body))).Exec()
	},
	"body-in-row": func(w *writer) error {
		return w.s.Query(`INSERT INTO bmessages (mailbox, bucket, uid, modseq, kind, added, flags, internal_date, size, blob, meta, data, h_uidnext, h_modseq, h_messages, h_size)
			VALUES (?, 0, ?, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			w.mailbox, w.uid, w.uid, flags, time.Now(), len(w.body), newID(), meta, w.body, w.uid+1, w.uid, w.uid, w.uid*int64(len(w.body))).Exec()
	},
}
