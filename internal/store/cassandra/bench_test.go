package cassandra

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/store"
	"quill/internal/usermgr"
)

// BenchmarkAppendModes compares, in one invocation on one cluster, the
// rate of appends through the user manager in the batch mode (ADR 0026)
// and in the ordered (LWT) mode, with Cassandra's own rate of single-row
// 4.7 KB inserts at the same write consistency (the cluster issue's
// performance section). Each phase runs QUILL_BENCH_WRITERS concurrent
// writers (default 32) for QUILL_BENCH_PHASE (default 10s); an append is
// one 4.7 KB message delivered inline to an INBOX, as SMTP delivery to one
// recipient does, to one of 64 users (uniform) or always the same one
// (hot). Run it with -benchtime 1x:
//
//	go test -run '^$' -bench BenchmarkAppendModes -benchtime 1x ./internal/store/cassandra/
func BenchmarkAppendModes(b *testing.B) {
	phase := 10 * time.Second
	if d, err := time.ParseDuration(os.Getenv("QUILL_BENCH_PHASE")); err == nil {
		phase = d
	}
	writers := 32
	if n, err := fmt.Sscan(os.Getenv("QUILL_BENCH_WRITERS"), &writers); n != 1 || err != nil {
		writers = 32
	}
	body := make([]byte, 4700)
	rand.Read(body)
	ctx := context.Background()
	only := os.Getenv("QUILL_BENCH_ONLY") // e.g. "batches-64": that phase alone (profiling)
	for i := 0; i < b.N; i++ {
		if only != "" {
			var mode string
			var boxes int
			if _, err := fmt.Sscanf(only, "%7s-%d", &mode, &boxes); err != nil {
				b.Fatalf("QUILL_BENCH_ONLY=%q: want MODE-MAILBOXES", only)
			}
			t := newAppendTarget(b, ctx, mode, boxes)
			b.ReportMetric(t.run(b, ctx, body, writers, phase), only+"-appends/s")
			t.e.Close()
			continue
		}
		// Phases alternate (raw, batches, ordered, and again) so that the
		// machine's load, which varies, weighs on each alike; each figure
		// is the mean of its two phases.
		rates := map[string]float64{}
		raw := newRawTarget(b, ctx)
		targets := map[string]*appendTarget{}
		for _, boxes := range []int{64, 1} {
			for _, mode := range []string{"batches", "ordered"} {
				targets[fmt.Sprintf("%s-%dmbox", mode, boxes)] = newAppendTarget(b, ctx, mode, boxes)
			}
		}
		for round := 0; round < 2; round++ {
			rates["raw"] += raw.run(b, ctx, body, writers, phase) / 2
			for _, boxes := range []int{64, 1} {
				for _, mode := range []string{"batches", "ordered"} {
					name := fmt.Sprintf("%s-%dmbox", mode, boxes)
					rates[name] += targets[name].run(b, ctx, body, writers, phase) / 2
				}
			}
		}
		raw.e.Close()
		for _, t := range targets {
			t.e.Close()
		}
		b.ReportMetric(rates["raw"], "raw-inserts/s")
		for name, r := range rates {
			if name != "raw" {
				b.ReportMetric(r, name+"-appends/s")
			}
		}
		b.ReportMetric(rates["batches-64mbox"]/rates["ordered-64mbox"], "batches/ordered")
		b.ReportMetric(rates["batches-1mbox"]/rates["ordered-1mbox"], "hot-batches/ordered")
		b.ReportMetric(rates["batches-64mbox"]/rates["raw"], "batches/raw")
		b.ReportMetric(rates["batches-1mbox"]/rates["batches-64mbox"], "hot/uniform")
	}
}

// run calls op from writers goroutines for d and returns completions per
// second; any error fails the benchmark.
func run(b *testing.B, writers int, d time.Duration, op func(w, i int) error) float64 {
	var done atomic.Int64
	var failed atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := op(w, i); err != nil {
					failed.Store(err)
					return
				}
				done.Add(1)
			}
		}()
	}
	t := time.NewTimer(d)
	<-t.C
	close(stop)
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	return float64(done.Load()) / time.Since(start).Seconds()
}

// rawTarget is a keyspace with a table of single 4.7 KB rows.
type rawTarget struct{ e *Engine }

func newRawTarget(b *testing.B, ctx context.Context) *rawTarget {
	e := openTest(b, newKeyspace(b))
	if err := e.s.Query(`CREATE TABLE IF NOT EXISTS raw_inserts (id blob PRIMARY KEY, data blob)`).WithContext(ctx).Exec(); err != nil {
		b.Fatal(err)
	}
	if err := e.s.AwaitSchemaAgreement(ctx); err != nil {
		b.Fatal(err)
	}
	return &rawTarget{e: e}
}

func (r *rawTarget) run(b *testing.B, ctx context.Context, body []byte, writers int, d time.Duration) float64 {
	return run(b, writers, d, func(w, i int) error {
		id := store.NewID()
		return r.e.write(ctx, `INSERT INTO raw_inserts (id, data) VALUES (?, ?)`, id[:], body).Exec()
	})
}

// appendTarget is a keyspace of one mode with boxes users, and a manager
// over it.
type appendTarget struct {
	e   *Engine
	m   *usermgr.Manager
	ids []store.ID
}

func newAppendTarget(b *testing.B, ctx context.Context, mode string, boxes int) *appendTarget {
	e := openTest(b, newKeyspace(b))
	var eng store.Engine = e
	if mode == "batches" {
		eng = e.Batches()
	}
	t := &appendTarget{e: e, m: usermgr.New(eng, usermgr.Options{})}
	for i := 0; i < boxes; i++ {
		u := fmt.Sprintf("u%d@example.test", i)
		if err := t.m.CreateUser(ctx, store.User{Address: u}); err != nil {
			b.Fatal(err)
		}
		mb, err := t.m.GetMailbox(ctx, u, "INBOX")
		if err != nil {
			b.Fatal(err)
		}
		t.ids = append(t.ids, mb.ID)
	}
	return t
}

func (t *appendTarget) run(b *testing.B, ctx context.Context, body []byte, writers int, d time.Duration) float64 {
	var next atomic.Int64
	return run(b, writers, d, func(w, i int) error {
		id := t.ids[int(next.Add(1))%len(t.ids)]
		_, err := t.m.Append(ctx, id, []store.NewMessage{{Body: body, Size: int64(len(body)), InternalDate: time.Now()}}, store.AppendOptions{})
		return err
	})
}
