package ingest_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/trend"
)

// BenchmarkIngest compares hotcount's subscriber (parse, validate, add to
// the aggregator) with a bare nats.go subscriber that only counts messages:
// same in-process server, same publisher, same 1,000 topics, same run. The
// ratio of their ns/op is hotcount's ingest cost against NATS's own. The
// payload is `{"count":1}`, as a producer sends it; hotcount-by's is
// `{"count":1,"by":"<id>"}` with a million distinct ids, each mention's
// contributor sketched for trending (trend.Contributors, as the sidecar
// runs it with time buckets on): its ratio to hotcount is the cost of
// "by".
func BenchmarkIngest(b *testing.B) {
	topics := make([]string, 1000)
	for i := range topics {
		topics[i] = "mentions.topic-" + strconv.Itoa(i)
	}
	count := func(buf []byte, _ int) []byte { return append(buf[:0], `{"count":1}`...) }
	run := func(b *testing.B, payload func(buf []byte, i int) []byte, subscribe func(nc *nats.Conn, got *atomic.Int64) (stop func())) {
		ns := testenv.NATS(b)
		sub, err := nats.Connect(ns.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Close()
		var got atomic.Int64
		stop := subscribe(sub, &got)
		defer stop()
		pub := testenv.Connect(b, ns.ClientURL())
		b.ReportAllocs()
		b.ResetTimer()
		var buf []byte
		for i := range b.N {
			buf = payload(buf, i)
			if err := pub.Publish(topics[i%len(topics)], buf); err != nil {
				b.Fatal(err)
			}
		}
		if err := pub.Flush(); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for got.Load() < int64(b.N) {
			if time.Now().After(deadline) {
				b.Fatalf("received %d of %d", got.Load(), b.N)
			}
			time.Sleep(100 * time.Microsecond)
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	}

	b.Run("bare", func(b *testing.B) {
		run(b, count, func(nc *nats.Conn, got *atomic.Int64) func() {
			s, err := nc.QueueSubscribe("mentions.>", "hotcount", func(*nats.Msg) { got.Add(1) })
			if err != nil {
				b.Fatal(err)
			}
			s.SetPendingLimits(1<<20, 256<<20) //nolint:errcheck // valid limits
			nc.Flush()                         //nolint:errcheck // the publisher flushes too
			return func() { s.Unsubscribe() }  //nolint:errcheck // closing anyway
		})
	})
	subscriber := func(b *testing.B, who ingest.Contributors) func(nc *nats.Conn, got *atomic.Int64) func() {
		return func(nc *nats.Conn, got *atomic.Int64) func() {
			reg := prometheus.NewRegistry()
			s, err := ingest.NewSubscriber(nc, ingest.Config{
				Subject: "mentions.>", QueueGroup: "hotcount", DrainTimeout: time.Second,
				Limits:       mention.Limits{MaxCount: mention.DefaultMaxCount, MaxTopicBytes: mention.DefaultMaxTopicBytes},
				Contributors: who,
			}, countingSink{aggregator.New(aggregator.DefaultMaxTopics, reg), got}, zap.NewNop(), ingest.NewMetrics(reg))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			for s.Ready() != nil {
				time.Sleep(time.Millisecond)
			}
			nc.Flush() //nolint:errcheck // the publisher flushes too
			return func() { cancel(); <-done }
		}
	}
	b.Run("hotcount", func(b *testing.B) {
		run(b, count, subscriber(b, nil))
	})
	b.Run("hotcount-by", func(b *testing.B) {
		by := func(buf []byte, i int) []byte {
			buf = append(buf[:0], `{"count":1,"by":"c`...)
			buf = strconv.AppendInt(buf, int64(i%1_000_000), 10)
			return append(buf, `"}`...)
		}
		run(b, by, subscriber(b, trend.NewContributors(prometheus.NewRegistry())))
	})
}

// countingSink adds to the aggregator and counts, so the benchmark knows
// when every message has been handled.
type countingSink struct {
	agg *aggregator.Aggregator
	got *atomic.Int64
}

func (c countingSink) Add(topic string, delta int64) {
	c.agg.Add(topic, delta)
	c.got.Add(1)
}
