package sidecar_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// BenchmarkJetStream measures how fast a stream of b.N stored mentions (1,000
// topics) is consumed: by a bare jetstream pull consumer that acknowledges
// each message as it arrives (explicit acks), and by the hotcount sidecar in
// JetStream mode, done when every mention is written (the durable engine:
// each flush writes by stream position and moves the checkpoint; embedded
// store, 100 ms flush interval). Same server, same stream contents, same
// run; the ratio of ns/op is the cost of counting each mention once.
func BenchmarkJetStream(b *testing.B) {
	fill := func(b *testing.B) (url string, js jetstream.JetStream) {
		b.StopTimer()
		ns := testenv.NATS(b)
		nc := testenv.Connect(b, ns.ClientURL())
		if _, err := ingest.EnsureStream(context.Background(), nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
			b.Fatal(err)
		}
		if _, err := loadgen.Run(context.Background(), nc, loadgen.Config{Prefix: "mentions.", Topics: 1000, Messages: int64(b.N), Count: 1, JetStream: true}); err != nil {
			b.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.StartTimer()
		return ns.ClientURL(), js
	}
	// until waits for done, polled every 10 ms, then stops the clock.
	until := func(b *testing.B, done func() error) {
		testenv.EventuallyEvery(b, 5*time.Minute, 10*time.Millisecond, done)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	}

	b.Run("bare", func(b *testing.B) {
		_, js := fill(b)
		cons, err := js.CreateOrUpdateConsumer(context.Background(), "MENTIONS", jetstream.ConsumerConfig{
			Durable: "hotcount", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100_000,
		})
		if err != nil {
			b.Fatal(err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) { m.Ack() }, jetstream.PullMaxMessages(1000)) //nolint:errcheck // measured by the consumer's state
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Stop()
		until(b, func() error {
			info, err := cons.Info(context.Background())
			if err != nil {
				return err
			}
			if info.NumPending != 0 || info.NumAckPending != 0 || info.Delivered.Stream < uint64(b.N) {
				return fmt.Errorf("consumer: %d pending, %d unacknowledged, %d of %d delivered", info.NumPending, info.NumAckPending, info.Delivered.Stream, b.N)
			}
			return nil
		})
	})
	b.Run("hotcount", func(b *testing.B) {
		url, _ := fill(b)
		cfg := config.Default()
		cfg.NATSURL, cfg.NATSMode = url, config.ModeJetStream
		cfg.Store, cfg.DataDir = config.StoreBolt, b.TempDir()
		cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
		cfg.FlushInterval = 100 * time.Millisecond
		sc := sidecartest.Run(b, cfg, nil)
		until(b, func() error {
			if n := testenv.Metric(b, sc.Registry(), "hotcount_flusher_flushed_mentions_total"); n < float64(b.N) {
				return fmt.Errorf("%v of %d mentions written", n, b.N)
			}
			return nil
		})
		if err := sc.Stop(); err != nil {
			b.Fatal(err)
		}
	})
}
