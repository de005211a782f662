package console

import (
	"math"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
)

// window is how far back the charts go, and how long after the last view
// the sampler keeps sampling.
const window = 5 * time.Minute

// The metrics the charts are drawn from (docs/METRICS.md).
const (
	metricMentionsIn = "hotcount_ingest_mentions_total"
	metricWritesOut  = "hotcount_store_writes_total"
	metricFlushed    = "hotcount_flusher_flushed_mentions_total"
	metricThrottled  = "hotcount_store_throttled_total"
	metricRerouted   = "hotcount_flusher_rerouted_total"
	metricFlush      = "hotcount_flusher_flush_seconds"
)

// sample is the registry's counters at one moment.
type sample struct {
	at                                         time.Time
	mentionsIn, writesOut, flushed             float64
	throttled, rerouted, flushSeconds, flushes float64
}

// sample gathers the registry into the ring.
func (c *Console) sample(now time.Time) {
	families, err := c.cfg.Metrics.Gather()
	if err != nil {
		// A collector failed; the others are still there.
		c.log.Debug("gather metrics", zap.Error(err))
	}
	s := sample{at: now}
	for _, f := range families {
		var sum, count float64
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				sum += m.GetHistogram().GetSampleSum()
				count += float64(m.GetHistogram().GetSampleCount())
			}
		}
		switch f.GetName() {
		case metricMentionsIn:
			s.mentionsIn = sum
		case metricWritesOut:
			s.writesOut = sum
		case metricFlushed:
			s.flushed = sum
		case metricThrottled:
			s.throttled = sum
		case metricRerouted:
			s.rerouted = sum
		case metricFlush:
			s.flushSeconds, s.flushes = sum, count
		}
	}
	c.ring.add(s)
}

// ring holds the last samples. It is safe for concurrent use.
type ring struct {
	mu   sync.Mutex
	buf  []sample
	next int // where the next sample goes
	n    int // samples held
}

func newRing(size int) *ring { return &ring{buf: make([]sample, size)} }

func (r *ring) add(s sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// series is the charts' data, one entry per sample after the first: each
// a rate over the span ending at that sample (up to smoothing seconds, as
// a flush every second would otherwise alias into seconds of 0 and of
// twice the rate). null marks no data: the first sample after a gap in
// sampling (nobody watched), a counter reset, or no flush in the span for
// FlushMs.
type series struct {
	T []int64 `json:"t"` // Unix ms of each sample
	// MentionsIn is mentions accepted per second, WritesOut store writes
	// per second.
	MentionsIn []number `json:"mentionsIn"`
	WritesOut  []number `json:"writesOut"`
	// Flushed is mentions written per second: over WritesOut, the
	// coalescing ratio.
	Flushed   []number `json:"flushed"`
	Throttled []number `json:"throttled"`
	Rerouted  []number `json:"rerouted"`
	// FlushMs is the mean flush duration over the span, in milliseconds.
	FlushMs []number `json:"flushMs"`
}

// smoothing is the span, in samples, each rate is taken over.
const smoothing = 5

// number is a float that encodes NaN as JSON's null.
type number float64

func (n number) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, math.Round(f*1000)/1000, 'f', -1, 64), nil
}

// maxGap is the longest time between two samples still taken as
// consecutive: the ticker may run late on a busy machine.
const maxGap = 2500 * time.Millisecond

// series returns the rates of the samples held, oldest first.
func (r *ring) series() series {
	r.mu.Lock()
	held := make([]sample, 0, r.n)
	for i := range r.n {
		held = append(held, r.buf[(r.next-r.n+i+len(r.buf))%len(r.buf)])
	}
	r.mu.Unlock()

	none := func() []number { return make([]number, 0, len(held)) }
	out := series{T: make([]int64, 0, len(held)), MentionsIn: none(), WritesOut: none(), Flushed: none(),
		Throttled: none(), Rerouted: none(), FlushMs: none()}
	run := 0 // the first sample of the current run without a gap
	for i := 1; i < len(held); i++ {
		if d := held[i].at.Sub(held[i-1].at); d <= 0 || d > maxGap {
			run = i
		}
		a, b := held[max(run, i-smoothing)], held[i]
		dt := b.at.Sub(a.at).Seconds()
		rate := func(x, y float64) number {
			// A counter that went down was reset: no rate.
			if dt <= 0 || y < x {
				return number(math.NaN())
			}
			return number((y - x) / dt)
		}
		flushMs := number(math.NaN())
		if b.flushes > a.flushes {
			flushMs = number((b.flushSeconds - a.flushSeconds) / (b.flushes - a.flushes) * 1000)
		}
		out.T = append(out.T, b.at.UnixMilli())
		out.MentionsIn = append(out.MentionsIn, rate(a.mentionsIn, b.mentionsIn))
		out.WritesOut = append(out.WritesOut, rate(a.writesOut, b.writesOut))
		out.Flushed = append(out.Flushed, rate(a.flushed, b.flushed))
		out.Throttled = append(out.Throttled, rate(a.throttled, b.throttled))
		out.Rerouted = append(out.Rerouted, rate(a.rerouted, b.rerouted))
		out.FlushMs = append(out.FlushMs, flushMs)
	}
	return out
}
