package flusher_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/pipeline/store"
)

// sink takes every write at once: what is measured is the flush's own
// work and what it holds readers up with, not a store.
type sink struct{}

func (sink) Add(context.Context, store.Write, time.Time) error { return nil }

// BenchmarkReadsDuringFlush: include=pending reads of one topic's
// pending mentions (ownwrites.View.Read, which also reads the buffer)
// while a flush plans and writes a window of a million topics (each a
// minute counter to split into a total and two buckets), against the same
// reads while no flush runs, in the same run: p50 and p99 of each, in
// microseconds. Run with -benchtime 1x: each iteration fills and flushes
// a million-topic window.
func BenchmarkReadsDuringFlush(b *testing.B) {
	const topics, idleReads = 1_000_000, 2_000_000
	now := func() time.Time { return time.Date(2026, 12, 5, 10, 0, 30, 0, time.UTC) }
	var idle, busy []time.Duration
	for b.Loop() {
		b.StopTimer()
		reg := prometheus.NewRegistry()
		agg := aggregator.New(2*topics, reg, aggregator.WithBuckets(now))
		for i := range topics {
			agg.AddAt("topic-"+strconv.Itoa(i), 1, now())
		}
		v := ownwrites.New(ownwrites.Config{Keep: time.Minute, Topics: 1000}, now)
		fl := flusher.New(flusher.Config{Shards: 1, Interval: time.Hour, Timeout: time.Hour, Concurrency: 256, Minutes: true, Hours: true},
			agg, sink{}, zap.NewNop(), flusher.NewMetrics(reg), now, flusher.WithView(v))
		read := func(stop <-chan struct{}, into *[]time.Duration) {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				v.Read("topic-7", ownwrites.Gather{At: now()})
				*into = append(*into, time.Since(start))
			}
		}
		// Idle: a fixed number of reads, no flush running.
		for range idleReads {
			start := time.Now()
			v.Read("topic-7", ownwrites.Gather{At: now()})
			idle = append(idle, time.Since(start))
		}
		b.StartTimer()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { read(stop, &busy) })
		if err := fl.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
		close(stop)
		wg.Wait()
	}
	pct := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(p*float64(len(d)-1))].Microseconds())
	}
	b.ReportMetric(pct(idle, 0.5), "idle-p50-µs")
	b.ReportMetric(pct(idle, 0.99), "idle-p99-µs")
	b.ReportMetric(pct(busy, 0.5), "flush-p50-µs")
	b.ReportMetric(pct(busy, 0.99), "flush-p99-µs")
	b.ReportMetric(pct(busy, 1), "flush-max-µs")
	b.ReportMetric(float64(len(busy)), "flush-reads")
}
