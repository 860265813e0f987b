package loadgen

import (
	"math/bits"
	"time"
)

// histogram records durations with a relative error below 1% in fixed
// memory (HDR-style: 128 linear sub-buckets per power of two). It is not
// safe for concurrent use; each worker owns one and they are merged.
type histogram struct {
	counts [(64-histSubBits)*histSub + histSub]uint64
	total  uint64
	max    uint64
}

const (
	histSubBits = 7
	histSub     = 1 << histSubBits
)

func histBucket(v uint64) int {
	if v < histSub {
		return int(v)
	}
	shift := bits.Len64(v) - histSubBits - 1
	return (shift+1)*histSub + int(v>>shift) - histSub
}

// histLow is the smallest value that falls in bucket i.
func histLow(i int) uint64 {
	if i < histSub {
		return uint64(i)
	}
	shift := i/histSub - 1
	return uint64(i%histSub+histSub) << shift
}

func (h *histogram) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histBucket(v)]++
	h.total++
	h.max = max(h.max, v)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.max = max(h.max, o.max)
}

// quantile returns the lower bound of the bucket holding the q-quantile
// (0 < q <= 1), or 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(q*float64(h.total) + 0.5)
	rank = min(max(rank, 1), h.total)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(histLow(i), h.max))
		}
	}
	return time.Duration(h.max)
}

// Latency summarises the time from the first command of a transaction to
// the server's final reply, over acknowledged messages.
type Latency struct {
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// Summary is the result of a Run.
type Summary struct {
	Elapsed   time.Duration `json:"elapsed_ns"`
	Attempted int64         `json:"attempted"`
	Acked     int64         `json:"acked"`
	Rejected  int64         `json:"rejected"`
	NoReply   int64         `json:"noreply"`
	// AckedBytes counts the octets of acknowledged messages once, however
	// many recipients each had.
	AckedBytes int64   `json:"acked_bytes"`
	MsgPerSec  float64 `json:"acked_msg_per_sec"`
	Latency    Latency `json:"latency"`
	// RejectCodes counts rejected transactions by deciding reply code.
	RejectCodes map[int]int64 `json:"reject_codes,omitempty"`
	// Connections counts the SMTP sessions opened (greeting and EHLO
	// answered): Attempted with one message per connection, about the
	// number of clients with persistent ones.
	Connections int64 `json:"connections"`
	// Errors counts transport failures by kind: "dial", "timeout", "io",
	// and "cancelled" for transactions cut short by the run's context.
	Errors map[string]int64 `json:"errors,omitempty"`
}

// workerStats is one worker's share of a Summary.
type workerStats struct {
	attempted, acked, rejected, noReply, ackedBytes int64
	conns                                           int64
	lat                                             histogram
	rejectCodes                                     map[int]int64
	errors                                          map[string]int64
}

func (w *workerStats) noteError(kind string) {
	if w.errors == nil {
		w.errors = make(map[string]int64)
	}
	w.errors[kind]++
}

// add counts one transaction; cancelled reports whether the run's context
// had ended, which explains a NoReply better than the error it caused.
func (w *workerStats) add(m *Message, res txResult, lat time.Duration, cancelled bool) {
	w.attempted++
	switch res.outcome {
	case Acked:
		w.acked++
		w.ackedBytes += int64(len(m.Data))
		w.lat.record(lat)
	case Rejected:
		w.rejected++
		if w.rejectCodes == nil {
			w.rejectCodes = make(map[int]int64)
		}
		w.rejectCodes[res.code]++
	case NoReply:
		w.noReply++
		switch {
		case cancelled:
			w.noteError("cancelled")
		case isTimeout(res.err):
			w.noteError("timeout")
		default:
			w.noteError("io")
		}
	}
}

func summarize(elapsed time.Duration, workers []*workerStats) Summary {
	var s Summary
	var lat histogram
	s.Elapsed = elapsed
	for _, w := range workers {
		s.Attempted += w.attempted
		s.Acked += w.acked
		s.Rejected += w.rejected
		s.NoReply += w.noReply
		s.AckedBytes += w.ackedBytes
		s.Connections += w.conns
		lat.merge(&w.lat)
		for k, v := range w.rejectCodes {
			if s.RejectCodes == nil {
				s.RejectCodes = make(map[int]int64)
			}
			s.RejectCodes[k] += v
		}
		for k, v := range w.errors {
			if s.Errors == nil {
				s.Errors = make(map[string]int64)
			}
			s.Errors[k] += v
		}
	}
	if elapsed > 0 {
		s.MsgPerSec = float64(s.Acked) / elapsed.Seconds()
	}
	s.Latency = Latency{
		P50: lat.quantile(0.50),
		P90: lat.quantile(0.90),
		P99: lat.quantile(0.99),
		Max: time.Duration(lat.max),
	}
	return s
}
