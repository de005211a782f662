package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/internal/testenv"
)

// holdingSink is the aggregator's part for the consumer: it holds messages
// until the test releases (acks) them.
type holdingSink struct {
	mu     sync.Mutex
	counts map[string]int64
	held   []aggregator.Acker
	at     map[string][]time.Time // each delivery's time bucket time, by topic
}

func (s *holdingSink) AddAcked(topic string, delta int64, m aggregator.Acker, _ int64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[topic] += delta
	s.held = append(s.held, m)
	if s.at == nil {
		s.at = make(map[string][]time.Time)
	}
	s.at[topic] = append(s.at[topic], at)
}

func (s *holdingSink) Held() []aggregator.Acker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]aggregator.Acker(nil), s.held...)
}

func (s *holdingSink) ackAll(t *testing.T) {
	for _, m := range s.Held() {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	s.held = nil
	s.mu.Unlock()
}

func (s *holdingSink) count(topic string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[topic]
}

type jsFixture struct {
	js   jetstream.JetStream
	reg  *prometheus.Registry
	sink *holdingSink
	stop context.CancelFunc
	done chan error
}

func startConsumer(t *testing.T, ackWait time.Duration, paused func() bool) *jsFixture {
	t.Helper()
	ns := testenv.NATS(t)
	pub := testenv.Connect(t, ns.ClientURL())
	created, err := ingest.EnsureStream(context.Background(), pub, "MENTIONS", "mentions.>", time.Minute)
	if err != nil || !created {
		t.Fatalf("EnsureStream = %v, %v; want created", created, err)
	}
	if created, err := ingest.EnsureStream(context.Background(), pub, "MENTIONS", "mentions.>", time.Minute); err != nil || created {
		t.Fatalf("second EnsureStream = %v, %v; want it left as it is", created, err)
	}
	js, err := jetstream.New(pub)
	if err != nil {
		t.Fatal(err)
	}
	fx := &jsFixture{js: js, reg: prometheus.NewRegistry(), sink: &holdingSink{counts: map[string]int64{}}, done: make(chan error, 1)}
	m := ingest.NewMetrics(fx.reg)
	nc, err := ingest.Connect(ns.ClientURL(), zaptest.NewLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if paused == nil {
		paused = func() bool { return false }
	}
	c, err := ingest.NewJetStreamConsumer(nc, ingest.Config{
		Subject: "mentions.>", DeadLetterSubject: "hotcount.dlq", DrainTimeout: time.Second,
		Limits: ingest.Limits{MaxCount: 100, MaxTopicBytes: 32},
	}, ingest.JetStreamConfig{Stream: "MENTIONS", Consumer: "hotcount", AckWait: ackWait, MaxAckPending: 10_000},
		fx.sink, paused, zaptest.NewLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fx.stop = cancel
	go func() { fx.done <- c.Run(ctx) }()
	testenv.Eventually(t, 5*time.Second, c.Ready)
	t.Cleanup(func() { cancel(); <-fx.done })
	return fx
}

func (fx *jsFixture) consumerInfo(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := fx.js.Consumer(context.Background(), "MENTIONS", "hotcount")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// TestHeldMessagesAreNotRedelivered holds messages for three AckWaits
// before acknowledging them: the keep-alive stops the server from handing
// them out again, so nothing is counted twice.
func TestHeldMessagesAreNotRedelivered(t *testing.T) {
	fx := startConsumer(t, 600*time.Millisecond, nil)
	ctx := context.Background()
	for range 50 {
		if _, err := fx.js.Publish(ctx, "mentions.held", nil); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := fx.sink.count("held"); n != 50 {
			return fmt.Errorf("%d of 50 received", n)
		}
		return nil
	})
	// Three AckWaits of holding: the point of the test is the wait.
	time.Sleep(1800 * time.Millisecond)
	if n := fx.sink.count("held"); n != 50 {
		t.Errorf("after holding for 3 AckWaits: %d counted, want 50 (redelivered: %v)", n,
			testenv.Metric(t, fx.reg, "hotcount_ingest_redelivered_total"))
	}
	if info := fx.consumerInfo(t); info.NumAckPending != 50 || info.NumRedelivered != 0 {
		t.Errorf("ack pending = %d, redelivered = %d; want 50 held, none redelivered", info.NumAckPending, info.NumRedelivered)
	}
	fx.sink.ackAll(t)
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := fx.consumerInfo(t).NumAckPending; n != 0 {
			return fmt.Errorf("ack pending %d after acks", n)
		}
		return nil
	})
}

// TestBadMessagesAreTerminated: a rejected message is dead-lettered and
// terminated, never redelivered; the valid ones around it are counted.
func TestBadMessagesAreTerminated(t *testing.T) {
	fx := startConsumer(t, 600*time.Millisecond, nil)
	ctx := context.Background()
	for _, p := range []string{`{"count": -1}`, ``, `garbage`, `{"count": 3}`} {
		if _, err := fx.js.Publish(ctx, "mentions.mixed", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	// The server's own view: all 4 delivered, the 2 rejected ones
	// terminated (no longer pending, so never redelivered), only the 2
	// valid ones held, nothing redelivered; and the handler has seen all 4.
	testenv.Eventually(t, 5*time.Second, func() error {
		info := fx.consumerInfo(t)
		if info.Delivered.Stream != 4 || info.NumPending != 0 || info.NumAckPending != 2 || info.NumRedelivered != 0 {
			return fmt.Errorf("delivered up to %d, %d pending, %d unacknowledged, %d redelivered; want 4, 0, the 2 valid messages held, 0",
				info.Delivered.Stream, info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		if n := fx.sink.count("mixed"); n != 4 {
			return fmt.Errorf("counted %d, want 1 + 3", n)
		}
		if n := testenv.Metric(t, fx.reg, "hotcount_ingest_invalid_total"); n < 2 {
			return fmt.Errorf("invalid = %v, want 2", n)
		}
		return nil
	})
	if n := testenv.Metric(t, fx.reg, "hotcount_ingest_invalid_total"); n != 2 {
		t.Errorf("invalid = %v, want 2 (each rejected once, not redelivered)", n)
	}
}

// TestPausedFetchesNothing: while the flusher reports failure, no message is
// taken; when it recovers, they all arrive.
func TestPausedFetchesNothing(t *testing.T) {
	var mu sync.Mutex
	paused := true
	looks := 0 // how often the consumer asked whether it is paused
	fx := startConsumer(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); looks++; return paused })
	ctx := context.Background()
	for range 20 {
		if _, err := fx.js.Publish(ctx, "mentions.wait", nil); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if testenv.Metric(t, fx.reg, "hotcount_ingest_paused_total") < 1 {
			return fmt.Errorf("not paused yet")
		}
		return nil
	})
	mu.Lock()
	from := looks
	mu.Unlock()
	testenv.Eventually(t, 5*time.Second, func() error { // a few more of the consumer's looks
		mu.Lock()
		defer mu.Unlock()
		if looks < from+3 {
			return fmt.Errorf("%d looks while paused, want 3", looks-from)
		}
		return nil
	})
	if n := fx.sink.count("wait"); n != 0 {
		t.Errorf("%d handled while paused, want 0", n)
	}
	if info := fx.consumerInfo(t); info.NumPending != 20 || info.NumAckPending != 0 {
		t.Errorf("server: %d pending, %d delivered unacknowledged; want all 20 still to deliver", info.NumPending, info.NumAckPending)
	}
	mu.Lock()
	paused = false
	mu.Unlock()
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := fx.sink.count("wait"); n != 20 {
			return fmt.Errorf("%d of 20 after resuming", n)
		}
		return nil
	})
}

// TestLongPauseCountsOnce: the flusher stops writing for three times
// --ack-wait while messages are arriving. Whatever nats.go had buffered
// when consuming stopped is dropped unhandled and redelivered by the
// server; after the pause every message is handled exactly once (a paused
// handler that held a buffer would have handled both the buffered copies
// and their redeliveries).
func TestLongPauseCountsOnce(t *testing.T) {
	var mu sync.Mutex
	paused := false
	fx := startConsumer(t, time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return paused })
	ctx := context.Background()
	publishN := func(n int) {
		for range n {
			if _, err := fx.js.Publish(ctx, "mentions.wait", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	publishN(100)
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := fx.sink.count("wait"); n != 100 {
			return fmt.Errorf("%d of 100 before the pause", n)
		}
		return nil
	})
	mu.Lock()
	paused = true
	mu.Unlock()
	publishN(400) // some may reach the handler before it stops
	// Paused for three AckWaits, so that what nats.go had buffered expires
	// on the server: the point of the test is the wait.
	time.Sleep(3 * time.Second)
	mu.Lock()
	paused = false
	mu.Unlock()
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := fx.sink.count("wait"); n < 500 {
			return fmt.Errorf("%d of 500 after the pause", n)
		}
		return nil
	})
	// The server's own view: all 500 delivered, each held by the handler
	// (kept alive, so never handed out again), and every redelivery the
	// server made handled: no copy is still on its way.
	testenv.Eventually(t, 10*time.Second, func() error {
		info := fx.consumerInfo(t)
		handled := testenv.Metric(t, fx.reg, "hotcount_ingest_redelivered_total")
		if info.Delivered.Stream != 500 || info.NumPending != 0 || info.NumAckPending != 500 || float64(info.NumRedelivered) != handled {
			return fmt.Errorf("delivered up to %d, %d pending, %d unacknowledged, %d redelivered of which %v handled",
				info.Delivered.Stream, info.NumPending, info.NumAckPending, info.NumRedelivered, handled)
		}
		return nil
	})
	if n := fx.sink.count("wait"); n != 500 {
		t.Errorf("handled %d, published 500: messages counted twice", n)
	}
}

// TestEnsureStreamRefusesTheLegacyStream: the previous release's
// partitioned stream (one stream, a partitioning transform) is not taken
// for jetstream mode's stream, where sidecars would consume nothing from
// it: EnsureStream refuses it with ErrLegacyStream, its message naming the
// way out.
func TestEnsureStreamRefusesTheLegacyStream(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t).ClientURL())
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: "mentions.>", Destination: "{{partition(8)}}.mentions.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.EnsureStream(ctx, nc, "MENTIONS", "mentions.>", time.Minute); !errors.Is(err, ingest.ErrLegacyStream) {
		t.Errorf("EnsureStream on the legacy stream = %v, want ErrLegacyStream", err)
	}
}

// TestBucketsByPublication: a message counts in the time bucket of its
// publication, the stream's timestamp, on every delivery: handed back and
// redelivered over a second later, it still gives its first delivery's
// time, so it lands in its original bucket.
func TestBucketsByPublication(t *testing.T) {
	fx := startConsumer(t, time.Second, nil)
	ack, err := fx.js.Publish(context.Background(), "mentions.golang", nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := fx.js.Stream(context.Background(), "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := s.GetMsg(context.Background(), ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if len(fx.sink.Held()) == 0 {
			return errors.New("not delivered yet")
		}
		return nil
	})
	// Over a second between publication and redelivery: the point of the
	// test is the wait.
	time.Sleep(1100 * time.Millisecond)
	for _, m := range fx.sink.Held() {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	var at []time.Time
	testenv.Eventually(t, 10*time.Second, func() error {
		fx.sink.mu.Lock()
		at = append(at[:0], fx.sink.at["golang"]...)
		fx.sink.mu.Unlock()
		if len(at) < 2 {
			return fmt.Errorf("%d deliveries, waiting for a redelivery", len(at))
		}
		return nil
	})
	for i, a := range at {
		if !a.Equal(stored.Time) {
			t.Errorf("delivery %d is bucketed at %v, the message was published at %v", i+1, a, stored.Time)
		}
	}
}
