// Package demo shows the hot-partition problem and hotcount's two answers,
// live: writers race against DynamoDB's per-key write ceiling, emulated
// (tools/ceiling) in front of a real DynamoDB API, for N = 1, 2, 4 and 8 shards, first writing
// every mention directly (one UpdateItem each), then coalescing them with
// hotcount's aggregator and flusher. It reports accepted mentions per second
// and throttles, as a table and as an SVG chart.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/ceiling"
	"github.com/hotcount/hotcount/tools/racer"
)

// Config is what to race.
type Config struct {
	// Endpoint is the DynamoDB API (dynalite) behind the ceiling.
	Endpoint string
	// Table is created if absent.
	Table string
	// Ceiling is the write units per second per key. DynamoDB's
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
	client, err := store.NewDynamoDBClient(ctx, cfg.Endpoint)
	if err != nil {
		return Result{}, err
	}
	reg := prometheus.NewRegistry()
	if _, err := store.CreateTable(ctx, client, cfg.Table); err != nil {
		return Result{}, err
	}
	dynamo := store.NewDynamoDB(client, cfg.Table, store.NewMetrics(reg))
	// The per-key ceiling in front of the store: a write over it is
	// refused as DynamoDB refuses it, before it is sent.
	st := ceiling.NewStore(ceiling.New(cfg.Ceiling, int(cfg.Ceiling/10)), dynamo)
	topic := fmt.Sprintf("demo-%d-%s-%d", n, mode(coalesced), time.Now().UnixNano())

	rctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	c := racer.Config{Topic: topic, Shards: n, Writers: cfg.Writers, FlushInterval: cfg.FlushInterval}
	var mentions atomic.Int64
	start := time.Now()
	if !coalesced {
		racer.Direct(rctx, c, st, func(err error) bool {
			if err == nil {
				mentions.Add(1)
			}
			// Another failure than a throttle ends the writer: the race
			// ends short, and says so in its figures.
			return err == nil || errors.Is(err, store.ErrThrottled) || rctx.Err() != nil
		})
	} else {
		// What was accepted is what reached the store within the race:
		// no final flush.
		racer.Coalesced(rctx, rctx, c, st, 0)
		got, err := dynamo.Gather(ctx, topic, n, true)
		if err != nil {
			return Result{}, err
		}
		sum, _ := schema.Sum(got)
		mentions.Store(sum)
	}
	elapsed := time.Since(start).Seconds()
	counts := st.Counts()
	return Result{
		Shards: n, Coalesced: coalesced,
		Mentions:  float64(mentions.Load()) / elapsed,
		Writes:    float64(counts.Writes) / elapsed,
		Throttled: int(counts.Throttled),
	}, nil
}
