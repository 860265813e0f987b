// Package pending applies pending deliveries (ADR 0034; the cluster
// issue's item 6). A node whose delivery cannot reach the user's manager
// in time records the message as a store.PendingDelivery in the user's
// bucket and answers 250 (internal/cluster/forward). The Applier of the
// node that manages the bucket, now or next, applies the bucket's records
// in their order, each exactly once (usermgr.Manager.ApplyPending), and
// deletes each once its append is durable.
//
// Every node polls the store's short list of buckets that may hold
// records (PendingBuckets) every Options.Interval, and drains those it
// manages: after a failover, the new manager applies what was recorded
// while the bucket had none within one interval of taking it.
package pending

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/store"
)

// DefaultInterval is how often the list of buckets with records is read.
const DefaultInterval = 500 * time.Millisecond

// page is how many records of a bucket are read at once.
const page = 100

// Manager applies one record (usermgr.Manager).
type Manager interface {
	ApplyPending(ctx context.Context, pd store.PendingDeliveries, p store.PendingDelivery) (already bool, err error)
}

// Owner says which buckets this node manages and counts the writes in
// flight on them (ownership.Owner).
type Owner interface {
	Manages(bucket uint32) uint64
	Begin(user string) (epoch uint64, done func() error, err error)
}

// Options configure Start.
type Options struct {
	Store    store.PendingDeliveries
	Manager  Manager
	Owner    Owner
	Interval time.Duration // DefaultInterval when zero
	// Timeout bounds one record's application (10 s when zero).
	Timeout    time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer // may be nil
}

// Applier applies the pending deliveries of the buckets this node
// manages.
type Applier struct {
	opts    Options
	log     *slog.Logger
	applied *prometheus.CounterVec
	latency prometheus.Histogram
	listed  prometheus.Gauge

	ctx  context.Context // ends at Close
	stop context.CancelFunc
	wg   sync.WaitGroup
	// warned is when each failing bucket was last logged (the loop's own).
	warned map[uint32]time.Time
}

// Start starts the applier's loop.
func Start(opts Options) (*Applier, error) {
	if opts.Store == nil || opts.Manager == nil || opts.Owner == nil {
		return nil, errors.New("pending: no store, manager or owner")
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Applier{opts: opts, log: opts.Logger, warned: map[uint32]time.Time{},
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_cluster_pending_deliveries_total",
			Help: "Pending deliveries this node's applier finished, by result (applied; already: an earlier attempt had applied it; dropped: its mailbox is gone).",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "quill_cluster_pending_delivery_seconds",
			Help:    "Time from a pending delivery's acceptance (its 250) to its application.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12),
		}),
		listed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quill_cluster_pending_buckets",
			Help: "Buckets that may hold pending deliveries, as the applier's last poll read them (the same list on every node; 0 once every record is applied).",
		}),
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{a.applied, a.latency, a.listed} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	a.ctx, a.stop = context.WithCancel(context.Background())
	a.wg.Add(1)
	go a.loop()
	return a, nil
}

// Close stops the applier: the record in progress is abandoned (its
// context ends) and left to the next round, here or at the bucket's
// next manager.
func (a *Applier) Close() {
	a.stop()
	a.wg.Wait()
}

func (a *Applier) loop() {
	defer a.wg.Done()
	tick := time.NewTicker(a.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-tick.C:
		}
		a.round(a.ctx)
	}
}

// round drains every listed bucket this node manages.
func (a *Applier) round(ctx context.Context) {
	buckets, err := a.opts.Store.PendingBuckets(ctx)
	if err != nil {
		a.log.Warn("cluster: listing buckets with pending deliveries", "err", err)
		return
	}
	a.listed.Set(float64(len(buckets)))
	for _, b := range buckets {
		if a.opts.Owner.Manages(b) == 0 {
			continue
		}
		if err := a.drain(ctx, b); err != nil && ctx.Err() == nil {
			a.warn(b, err)
		}
	}
}

// warnEvery bounds how often a bucket whose records keep failing is
// logged: every round retries it.
const warnEvery = 30 * time.Second

// warn logs a bucket's failure, at most once per warnEvery per bucket.
func (a *Applier) warn(bucket uint32, err error) {
	now := time.Now()
	if last, ok := a.warned[bucket]; ok && now.Sub(last) < warnEvery {
		return
	}
	a.warned[bucket] = now
	a.log.Warn("cluster: applying pending deliveries; trying again every round", "bucket", bucket, "err", err)
}

// drain applies bucket's records in order until none is left, this node
// stops managing the bucket, or one fails (the next round resumes there:
// the records after it wait, so that they stay in order).
func (a *Applier) drain(ctx context.Context, bucket uint32) error {
	for {
		recs, err := a.opts.Store.ListPending(ctx, bucket, page)
		if err != nil || len(recs) == 0 {
			return err
		}
		for _, p := range recs {
			if a.opts.Owner.Manages(bucket) == 0 {
				return nil
			}
			if err := a.apply(ctx, p); err != nil {
				return err
			}
		}
	}
}

// apply applies one record and deletes it. A write whose lease lapsed
// before it completed (done fails) leaves the record to the next manager,
// whose check finds whether it landed.
func (a *Applier) apply(ctx context.Context, p store.PendingDelivery) error {
	ctx, cancel := context.WithTimeout(ctx, a.opts.Timeout)
	defer cancel()
	_, done, err := a.opts.Owner.Begin(p.User)
	if err != nil {
		return err
	}
	already, err := a.opts.Manager.ApplyPending(ctx, a.opts.Store, p)
	if derr := done(); err == nil && derr != nil {
		return derr
	}
	result := "applied"
	switch {
	case errors.Is(err, store.ErrNotFound):
		result = "dropped"
		a.log.Warn("cluster: a pending delivery's mailbox is gone; dropping it", "user", p.User, "mailbox", p.Mailbox)
	case err != nil:
		return err
	case already:
		result = "already"
	}
	if err := a.opts.Store.DeletePending(ctx, p); err != nil {
		return err
	}
	a.applied.WithLabelValues(result).Inc()
	if result != "dropped" {
		a.latency.Observe(time.Since(time.Unix(0, p.At)).Seconds())
	}
	return nil
}
