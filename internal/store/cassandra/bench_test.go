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
	for i := 0; i < b.N; i++ {
		raw := rawInserts(b, ctx, body, writers, phase)
		b.ReportMetric(raw, "raw-inserts/s")
		rates := map[string]float64{}
		for _, mode := range []string{"batches", "ordered"} {
			for _, boxes := range []int{64, 1} {
				r := managerAppends(b, ctx, mode, boxes, body, writers, phase)
				name := fmt.Sprintf("%s-%dmbox", mode, boxes)
				rates[name] = r
				b.ReportMetric(r, name+"-appends/s")
			}
		}
		b.ReportMetric(rates["batches-64mbox"]/rates["ordered-64mbox"], "batches/ordered")
		b.ReportMetric(rates["batches-64mbox"]/raw, "batches/raw")
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

func rawInserts(b *testing.B, ctx context.Context, body []byte, writers int, d time.Duration) float64 {
	e := openTest(b, newKeyspace(b))
	defer e.Close()
	if err := e.s.Query(`CREATE TABLE IF NOT EXISTS raw_inserts (id blob PRIMARY KEY, data blob)`).WithContext(ctx).Exec(); err != nil {
		b.Fatal(err)
	}
	if err := e.s.AwaitSchemaAgreement(ctx); err != nil {
		b.Fatal(err)
	}
	return run(b, writers, d, func(w, i int) error {
		id := store.NewID()
		return e.write(ctx, `INSERT INTO raw_inserts (id, data) VALUES (?, ?)`, id[:], body).Exec()
	})
}

func managerAppends(b *testing.B, ctx context.Context, mode string, boxes int, body []byte, writers int, d time.Duration) float64 {
	e := openTest(b, newKeyspace(b))
	defer e.Close()
	var eng store.Engine = e
	if mode == "batches" {
		eng = e.Batches()
	}
	m := usermgr.New(eng, usermgr.Options{})
	var ids []store.ID
	for i := 0; i < boxes; i++ {
		u := fmt.Sprintf("u%d@example.test", i)
		if err := m.CreateUser(ctx, store.User{Address: u}); err != nil {
			b.Fatal(err)
		}
		mb, err := m.GetMailbox(ctx, u, "INBOX")
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, mb.ID)
	}
	var next atomic.Int64
	return run(b, writers, d, func(w, i int) error {
		id := ids[int(next.Add(1))%len(ids)]
		_, err := m.Append(ctx, id, []store.NewMessage{{Body: body, Size: int64(len(body)), InternalDate: time.Now()}}, store.AppendOptions{})
		return err
	})
}
