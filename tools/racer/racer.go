// Package racer is the engine of hotcount's hot-partition demonstrations:
// writers offer mentions of one hot topic to a store, either directly (one
// write a mention, each writer a writer of its own, as an app writing to
// DynamoDB is) or through hotcount's aggregator and flusher (one write a
// topic a flush). `hotcount demo` races the two against DynamoDB's
// per-key ceiling emulated in front of dynalite (tools/demo), and the
// console (tools/console/race.go) against a rate limiter in memory.
package racer

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// Config is one side of a race.
type Config struct {
	// Topic is the one hot topic.
	Topic string
	// Shards is the shard count the topic is written on.
	Shards int
	// Writers offer mentions at once.
	Writers int
	// Every is how often each writer offers a mention; 0: as fast as it
	// can (the direct writers then wait for each write).
	Every time.Duration
	// FlushInterval is the coalescing flusher's interval.
	FlushInterval time.Duration
}

// Direct offers mentions as one write each until ctx ends, and returns
// then. Each write's error goes to done (nil: applied), which must be safe
// for concurrent use; done returning false ends that writer (the store
// failed, and the race ends short).
func Direct(ctx context.Context, c Config, st flusher.Store, done func(err error) bool) {
	var wg sync.WaitGroup
	for range c.Writers {
		wg.Go(func() {
			// Each direct writer is a writer of its own, as an app is.
			id, seq := store.NewWriterID(), store.NewSequencer(time.Now)
			offer(ctx, c.Every, func() bool {
				w := store.Write{Counter: schema.TotalOf(c.Topic), Shard: rand.IntN(c.Shards), Delta: 1, Writer: id, Seq: seq.Next()}
				return done(st.Add(ctx, w, time.Now()))
			})
		})
	}
	wg.Wait()
}

// Coalesced offers mentions to an aggregator flushed into st until ctx
// ends, then writes the last window as a sidecar's final flush would,
// within finalTimeout (unless stop has ended: the caller is stopping).
// The aggregator and flusher count into a registry of their own: a race
// never shows in the sidecar's metrics.
func Coalesced(ctx, stop context.Context, c Config, st flusher.Store, finalTimeout time.Duration) {
	reg := prometheus.NewRegistry()
	agg := aggregator.New(aggregator.DefaultMaxTopics, reg)
	fl := flusher.New(flusher.Config{Shards: c.Shards, Interval: c.FlushInterval, Timeout: c.FlushInterval, Concurrency: 4},
		agg, st, zap.NewNop(), flusher.NewMetrics(reg), time.Now)
	var wg sync.WaitGroup
	wg.Go(func() { fl.Run(ctx) }) //nolint:errcheck // it returns nil
	for range c.Writers {
		wg.Go(func() { offer(ctx, c.Every, func() bool { agg.Add(c.Topic, 1); return true }) })
	}
	wg.Wait()
	if stop.Err() == nil {
		fctx, cancel := context.WithTimeout(stop, finalTimeout)
		fl.Final(fctx) //nolint:errcheck // the store takes it or the race ends without it
		cancel()
	}
}

// offer calls fn every interval until ctx ends or fn returns false; with
// no interval, as fast as it can, pausing a millisecond every 1,024 calls
// to leave the flusher a core. A ticker drops the ticks it is late for,
// so a busy machine offers less rather than bursting.
func offer(ctx context.Context, every time.Duration, fn func() bool) {
	if every <= 0 {
		for i := 0; ctx.Err() == nil; i++ {
			if !fn() {
				return
			}
			if i%1024 == 1023 {
				time.Sleep(time.Millisecond) // pacing, not synchronisation
			}
		}
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !fn() {
				return
			}
		}
	}
}
