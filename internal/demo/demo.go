// Package demo shows the hot-partition problem and hotcount's two answers,
// live: writers race against the fault emulator's per-key write ceiling in
// front of a real DynamoDB API, for N = 1, 2, 4 and 8 shards, first writing
// every mention directly (one UpdateItem each), then coalescing them with
// hotcount's aggregator and flusher. It reports accepted mentions per second
// and throttles, as a table and as an SVG chart.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/flusher"
	"github.com/hotcount/hotcount/internal/ddbfault"
	"github.com/hotcount/hotcount/store"
)

// Config is what to race.
type Config struct {
	// Endpoint is the DynamoDB API (dynalite) behind the emulator.
	Endpoint string
	// Table is created if absent.
	Table string
	// Ceiling is the emulator's write units per second per key. DynamoDB's
	// is 1,000; the demo scales it down so that the ceiling, not the local
	// DynamoDB API's own speed, is what the race meets.
	Ceiling float64
	// Shards are the shard counts to race, like 1, 2, 4, 8.
	Shards []int
	// Writers is the number of concurrent writers.
	Writers int
	// Duration is how long each race runs.
	Duration time.Duration
	// FlushInterval is the coalescing flusher's interval.
	FlushInterval time.Duration
}

// Result is one race.
type Result struct {
	Shards    int
	Coalesced bool
	// Mentions per second accepted into the store.
	Mentions float64
	// Writes per second accepted (UpdateItem calls that succeeded).
	Writes float64
	// Throttled is how many writes the ceiling refused.
	Throttled int
}

// Run runs every race and returns the results in order.
func Run(ctx context.Context, cfg Config, progress io.Writer) ([]Result, error) {
	var results []Result
	for _, n := range cfg.Shards {
		for _, coalesced := range []bool{false, true} {
			r, err := race(ctx, cfg, n, coalesced)
			if err != nil {
				return results, err
			}
			fmt.Fprintf(progress, "N=%d %-9s %12.0f mentions/s %8.0f writes/s %7d throttled\n",
				n, mode(coalesced), r.Mentions, r.Writes, r.Throttled)
			results = append(results, r)
		}
	}
	return results, nil
}

func mode(coalesced bool) string {
	if coalesced {
		return "coalesced"
	}
	return "direct"
}

func race(ctx context.Context, cfg Config, n int, coalesced bool) (Result, error) {
	proxy := ddbfault.New(ddbfault.Config{Upstream: cfg.Endpoint, WriteUnits: cfg.Ceiling, WriteBurst: int(cfg.Ceiling / 10)})
	url, stop, err := proxy.Serve("127.0.0.1:0")
	if err != nil {
		return Result{}, err
	}
	defer stop() //nolint:errcheck // closing
	client, err := store.NewDynamoDBClient(ctx, url)
	if err != nil {
		return Result{}, err
	}
	reg := prometheus.NewRegistry()
	st := store.NewDynamoDB(client, cfg.Table, store.NewMetrics(reg))
	if _, err := store.CreateTable(ctx, client, cfg.Table); err != nil {
		return Result{}, err
	}
	topic := fmt.Sprintf("demo-%d-%s-%d", n, mode(coalesced), time.Now().UnixNano())

	rctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var mentions, writes atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	if !coalesced {
		for range cfg.Writers {
			wg.Go(func() {
				// Each direct writer is a writer of its own, as a sidecar is.
				id, seq := store.NewWriterID(), store.NewSequencer(time.Now)
				for rctx.Err() == nil {
					err := st.Add(rctx, store.Write{Topic: topic, Shard: rand.IntN(n), Delta: 1, Writer: id, Seq: seq.Next()}, time.Now())
					if err == nil {
						mentions.Add(1)
						writes.Add(1)
					} else if !errors.Is(err, store.ErrThrottled) && rctx.Err() == nil {
						return // the store failed: the race ends short, and says so below
					}
				}
			})
		}
		wg.Wait()
	} else {
		agg := aggregator.New(aggregator.DefaultMaxTopics, reg)
		fl := flusher.New(flusher.Config{Shards: n, Interval: cfg.FlushInterval, Timeout: cfg.FlushInterval, Concurrency: 4},
			agg, st, zap.NewNop(), flusher.NewMetrics(reg), time.Now)
		var flushing sync.WaitGroup
		flushing.Go(func() { fl.Run(rctx) }) //nolint:errcheck // it returns nil
		for range cfg.Writers {
			wg.Go(func() {
				for i := 0; rctx.Err() == nil; i++ {
					agg.Add(topic, 1)
					if i%1024 == 0 {
						time.Sleep(time.Millisecond) // leave the flusher a core
					}
				}
			})
		}
		wg.Wait()
		flushing.Wait()
		// What was accepted is what reached the store within the race.
		got, err := st.Gather(ctx, topic, n, true)
		if err != nil {
			return Result{}, err
		}
		sum, _ := store.Sum(got)
		mentions.Store(sum)
		var w int
		for _, k := range proxy.Stats().Writes {
			w += k
		}
		writes.Store(int64(w))
	}
	elapsed := time.Since(start).Seconds()
	return Result{
		Shards: n, Coalesced: coalesced,
		Mentions:  float64(mentions.Load()) / elapsed,
		Writes:    float64(writes.Load()) / elapsed,
		Throttled: proxy.Stats().Did[ddbfault.Throttled],
	}, nil
}
