package ingest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/internal/testenv"
)

// noOwner owns nothing: Run never gets past binding in these tests.
type noOwner struct{}

var _ ingest.Owner = noOwner{}

func (noOwner) Owned(int) []int          { return nil }
func (noOwner) Changed() <-chan struct{} { return nil }
func (noOwner) Settled() bool            { return false }

// TestBindStopsWhenContextEnds: a consumer that cannot bind (no stream, or
// the previous release's partitioned stream) retries with backoff until
// its context ends, and then Run returns at once, in the middle of a wait:
// SIGTERM during start-up is not held for the rest of it.
func TestBindStopsWhenContextEnds(t *testing.T) {
	cases := []struct {
		name       string
		partitions int  // the consumer's
		legacy     bool // a stream of the previous release's partitioned layout; false: no stream
		retry      string
		// after is the retry whose log line is waited for: by then the
		// wait that follows is over a second long (100 ms doubling: 1.6 s
		// after the fifth; a partitioned stream: 5 s after each).
		after int32
	}{
		{"no stream", 0, false, "cannot bind consumer; retrying", 5},
		{"no stream, partitioned", 4, false, "cannot consume the partition streams; retrying", 5},
		{"legacy partitioned stream", 0, true, "the stream is the previous release's partitioned stream: see deploy/README.md, \"Moving to partition streams\"; retrying", 1},
		{"legacy partitioned stream, partitioned", 4, true, "cannot consume the partition streams; retrying", 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := testenv.NATS(t)
			if tc.legacy {
				js, err := jetstream.New(testenv.Connect(t, ns.ClientURL()))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"},
					SubjectTransform: &jetstream.SubjectTransformConfig{Source: "mentions.>", Destination: "{{partition(8)}}.mentions.>"}}); err != nil {
					t.Fatal(err)
				}
			}
			waiting := make(chan struct{})
			var retries atomic.Int32
			log := zaptest.NewLogger(t, zaptest.WrapOptions(zap.Hooks(func(e zapcore.Entry) error {
				if e.Message == tc.retry && retries.Add(1) == tc.after {
					close(waiting)
				}
				return nil
			})))
			m := ingest.NewMetrics(prometheus.NewRegistry())
			nc, err := ingest.Connect(ns.ClientURL(), zaptest.NewLogger(t), m)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			jcfg := ingest.JetStreamConfig{Stream: "MENTIONS", Consumer: "hotcount", AckWait: time.Second, MaxAckPending: 100, Partitions: tc.partitions}
			if tc.partitions > 0 {
				jcfg.Owner = noOwner{}
			}
			c, err := ingest.NewJetStreamConsumer(nc, ingest.Config{
				Subject: "mentions.>", DeadLetterSubject: "hotcount.dlq", DrainTimeout: time.Second,
				Limits: ingest.Limits{MaxCount: 100, MaxTopicBytes: 32},
			}, jcfg, &holdingSink{counts: map[string]int64{}}, func() bool { return false }, log, m)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()

			select {
			case <-waiting:
			case err := <-done:
				t.Fatalf("Run = %v before its context ended, want it retrying", err)
			}
			cancel()
			ended := time.Now()
			if err := <-done; err != nil {
				t.Errorf("Run = %v, want nil: its context ended before it bound", err)
			}
			if d := time.Since(ended); d > time.Second {
				t.Errorf("Run returned %v after its context ended, want at once (it was in a wait of over a second)", d)
			}
			if c.Ready() == nil {
				t.Error("Ready = nil after Run gave up binding")
			}
		})
	}
}
