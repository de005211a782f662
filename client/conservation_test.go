package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestPublisherConservesAcrossNATSRestart: producers written as Example
// writes them publish mentions over many topics with JetStream to a
// sidecar in JetStream mode; midway the NATS server restarts (same port,
// same JetStream folder). Afterwards the sidecar's store holds, topic by
// topic, exactly what was passed to Mention: nothing lost while the server
// was away (publishes retried, mentions held meanwhile), nothing counted
// twice (a retry of a stored publish carries its first id, and the stream
// holds one message per acknowledged publish).
//
// The sidecar flushes every 50 ms, so it writes and checkpoints while the
// server goes away: a checkpoint lost with it has the stream read again
// from the last one stored, and the positions the items record keep what
// is read again from being counted twice.
func TestPublisherConservesAcrossNATSRestart(t *testing.T) {
	dir := t.TempDir()
	ns := testenv.NATS(t)
	hc, err := startHotcount(ns.ClientURL(), config.ModeJetStream, dir, func(c *config.Config) { c.FlushInterval = 50 * time.Millisecond })
	if err != nil {
		t.Fatal(err)
	}
	defer hc.stop() //nolint:errcheck // stopped and checked below
	ctx := context.Background()

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var acked atomic.Int64 // messages the stream acknowledged
	pub, err := client.NewPublisher(nc, client.WithOnDone(func(_ string, _ int64, err error) {
		if err == nil {
			acked.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}

	const producers, topics = 4, 300
	var (
		mu       sync.Mutex
		want     = make(map[string]int64) // what Mention accepted, by topic
		accepted atomic.Int64             // Mention calls accepted
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for p := range producers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				topic := fmt.Sprintf("topic-%d", (i*7+p)%topics)
				if i%3 == 0 {
					topic = fmt.Sprintf("eu.west.%d", i%topics)
				}
				n := int64(i%5 + 1)
				if err := pub.Mention(ctx, topic, n); err != nil {
					t.Errorf("Mention: %v", err)
					return
				}
				mu.Lock()
				want[topic] += n
				mu.Unlock()
				accepted.Add(1)
				if i%100 == 0 {
					time.Sleep(time.Millisecond) // a producer, not a benchmark: the run spans the restart
				}
			}
		})
	}
	atLeast := func(n int64) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func() error {
			if a := accepted.Load(); a < n {
				return fmt.Errorf("%d mentions accepted", a)
			}
			return nil
		})
	}
	// Restart once the producers have been publishing for a while, so
	// that the server goes with publishes in flight and mentions held.
	testenv.Eventually(t, 30*time.Second, func() error {
		if a := acked.Load(); a < 1000 {
			return fmt.Errorf("%d messages acknowledged", a)
		}
		return nil
	})
	before := acked.Load()
	ns = testenv.RestartNATS(t, ns)
	// Mentions taken while the server was away are published once the
	// producer is back; more are published after that.
	testenv.Eventually(t, 30*time.Second, func() error {
		if !nc.IsConnected() || nc.Stats().Reconnects == 0 {
			return fmt.Errorf("producer connection: %s", nc.Status())
		}
		return nil
	})
	atLeast(accepted.Load() + 20_000)
	close(stop)
	wg.Wait()
	closeCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := pub.Close(closeCtx); err != nil {
		t.Fatalf("Close: %v", err)
	}

	var total int64
	names := make([]string, 0, len(want))
	for topic, n := range want {
		names = append(names, topic)
		total += n
	}
	if stored := streamMsgs(t, testenv.Connect(t, ns.ClientURL())); stored != uint64(acked.Load()) {
		t.Fatalf("the stream holds %d messages, the Publisher had %d acknowledged: a retry was stored twice", stored, acked.Load())
	}
	// Everything is in the sidecar's window once it has taken all that
	// was mentioned; its final flush writes it at shutdown.
	testenv.Eventually(t, time.Minute, func() error {
		if got, err := gauge(hc.sc, "hotcount_ingest_mentions_total"); err != nil || int64(got) < total {
			return fmt.Errorf("the sidecar took %v of %d mentions (%v)", got, total, err)
		}
		return nil
	})
	if err := hc.stop(); err != nil {
		t.Fatalf("sidecar: %v", err)
	}

	// What the store holds, read as an app reads it, from a sidecar on the
	// same data.
	again, err := startHotcount(ns.ClientURL(), config.ModeJetStream, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.stop() //nolint:errcheck // test teardown
	rd, err := client.NewReader(again.httpURL)
	if err != nil {
		t.Fatal(err)
	}
	totals, err := rd.Totals(ctx, names, client.WithConsistency(client.Strong))
	if err != nil {
		t.Fatal(err)
	}
	var stored int64
	for _, got := range totals {
		stored += got.Count
		if got.Count != want[got.Topic] {
			t.Errorf("%s: %d in the store, %d mentioned", got.Topic, got.Count, want[got.Topic])
		}
	}
	if nc.Stats().Reconnects == 0 {
		t.Error("the producer's connection never broke: the restart tested nothing")
	}
	t.Logf("%d Mention calls, %d mentions over %d topics in %d messages (%d acknowledged before the restart); %d in the store; producer reconnects %d",
		accepted.Load(), total, len(want), acked.Load(), before, stored, nc.Stats().Reconnects)
}
