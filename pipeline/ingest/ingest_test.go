package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
)

// sink records what the subscriber accepted.
type sink struct {
	mu     sync.Mutex
	counts map[string]int64
}

func (s *sink) Add(topic string, delta int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[topic] += delta
}

func (s *sink) snapshot() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out
}

func newSubscriber(t *testing.T, url string, reg *prometheus.Registry, k ingest.Sink) (*ingest.Subscriber, context.CancelFunc, <-chan error) {
	t.Helper()
	m := ingest.NewMetrics(reg)
	nc, err := ingest.Connect(url, zaptest.NewLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sub, err := ingest.NewSubscriber(nc, ingest.Config{
		Subject:           "mentions.>",
		QueueGroup:        "hotcount",
		DeadLetterSubject: "hotcount.dlq",
		DrainTimeout:      5 * time.Second,
		Limits:            mention.Limits{MaxCount: 100, MaxTopicBytes: 32},
	}, k, zaptest.NewLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	testenv.Eventually(t, 5*time.Second, sub.Ready)
	return sub, cancel, done
}

// TestValidAroundInvalid publishes good and bad messages interleaved: the
// good ones are counted exactly, each bad one is counted by reason and
// dead-lettered with its reason and original subject, and the subscriber
// keeps going.
func TestValidAroundInvalid(t *testing.T) {
	ns := testenv.NATS(t)
	reg := prometheus.NewRegistry()
	k := &sink{counts: map[string]int64{}}
	_, stop, done := newSubscriber(t, ns.ClientURL(), reg, k)

	pub := testenv.Connect(t, ns.ClientURL())
	dlq, err := pub.SubscribeSync("hotcount.dlq")
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	bad := []struct{ subject, payload, reason string }{
		{"mentions.golang", `{"count": -1}`, mention.ReasonCount},
		{"mentions.golang", `{"count": 101}`, mention.ReasonCount},
		{"mentions.golang", `{"count": "3"}`, mention.ReasonCount},
		{"mentions.golang", `not json`, mention.ReasonPayload},
		{"mentions.a\x01b", ``, mention.ReasonTopic},
		{"mentions.this-topic-is-far-longer-than-thirty-two-bytes", ``, mention.ReasonTopic},
	}
	for range 10 {
		for _, b := range bad {
			must(t, pub.Publish(b.subject, []byte(b.payload)))
			must(t, pub.Publish("mentions.golang", nil))
			must(t, pub.Publish("mentions.eu.west.k8s", []byte(`{"count": 4}`)))
		}
	}
	must(t, pub.Flush())

	testenv.Eventually(t, 5*time.Second, func() error {
		if n := testenv.Metric(t, reg, "hotcount_ingest_events_total"); n != 120 {
			return fmt.Errorf("%v messages accepted, want 120", n)
		}
		return nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := k.snapshot()
	if got["golang"] != 60 || got["eu.west.k8s"] != 240 || len(got) != 2 {
		t.Errorf("accepted %v, want golang:60 eu.west.k8s:240", got)
	}
	for reason, want := range map[string]float64{mention.ReasonCount: 30, mention.ReasonPayload: 10, mention.ReasonTopic: 20} {
		if n := testenv.MetricWith(t, reg, "hotcount_ingest_invalid_total", "reason", reason); n != want {
			t.Errorf("invalid{reason=%s} = %v, want %v", reason, n, want)
		}
	}
	if n := testenv.Metric(t, reg, "hotcount_ingest_mentions_total"); n != 300 {
		t.Errorf("mentions_total = %v, want 300", n)
	}

	for i := range 60 {
		msg, err := dlq.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("dead letter %d: %v", i, err)
		}
		b := bad[i%len(bad)]
		if r := msg.Header.Get(ingest.ErrorHeader); r != b.reason {
			t.Errorf("dead letter %d: %s = %q, want %q", i, ingest.ErrorHeader, r, b.reason)
		}
		if s := msg.Header.Get("Hotcount-Subject"); s != b.subject || string(msg.Data) != b.payload {
			t.Errorf("dead letter %d: subject %q payload %q, want %q %q", i, s, msg.Data, b.subject, b.payload)
		}
	}
}

// TestQueueGroupSharesTheStream runs two subscribers in one queue group:
// every message is taken by exactly one of them.
func TestQueueGroupSharesTheStream(t *testing.T) {
	ns := testenv.NATS(t)
	sinks := []*sink{{counts: map[string]int64{}}, {counts: map[string]int64{}}}
	var stops []context.CancelFunc
	var dones []<-chan error
	for _, k := range sinks {
		_, stop, done := newSubscriber(t, ns.ClientURL(), prometheus.NewRegistry(), k)
		stops, dones = append(stops, stop), append(dones, done)
	}
	pub := testenv.Connect(t, ns.ClientURL())
	for range 2000 {
		must(t, pub.Publish("mentions.shared", nil))
	}
	must(t, pub.Flush())
	testenv.Eventually(t, 5*time.Second, func() error {
		if a, b := sinks[0].snapshot()["shared"], sinks[1].snapshot()["shared"]; a+b != 2000 {
			return fmt.Errorf("%d + %d accepted, want 2000", a, b)
		}
		return nil
	})
	for i := range stops {
		stops[i]()
		if err := <-dones[i]; err != nil {
			t.Fatal(err)
		}
	}
	if a, b := sinks[0].snapshot()["shared"], sinks[1].snapshot()["shared"]; a == 0 || b == 0 {
		t.Errorf("split %d/%d: the queue group should spread messages over both", a, b)
	}
}

// TestDrainHandlesWhatWasSent sends mentions and stops the subscriber at
// once: everything the server took before the drain is handled.
func TestDrainHandlesWhatWasSent(t *testing.T) {
	ns := testenv.NATS(t)
	k := &sink{counts: map[string]int64{}}
	_, stop, done := newSubscriber(t, ns.ClientURL(), prometheus.NewRegistry(), k)
	pub := testenv.Connect(t, ns.ClientURL())
	for range 20_000 {
		must(t, pub.Publish("mentions.burst", nil))
	}
	must(t, pub.Flush())
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := k.snapshot()["burst"]; n != 20_000 {
		t.Errorf("handled %d of 20000 after drain", n)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestConnectErrorRedacts: a URL's password never reaches an error
// message, even one that does not parse.
func TestConnectErrorRedacts(t *testing.T) {
	for _, u := range []string{"nats://alice:s3cret@127.0.0.1:1", "nats://s3cret@127.0.0.1:1", "nats://bob:s3%zzcret@127.0.0.1:1",
		"nats://AbC/s3+g@127.0.0.1:1", "nats://alice:s3?x@127.0.0.1:1", "nats://alice:12/s3@127.0.0.1:1"} {
		_, err := ingest.Connect(u, zap.NewNop(), ingest.NewMetrics(prometheus.NewRegistry()), nats.RetryOnFailedConnect(false))
		if err == nil {
			t.Fatalf("connect %s: no error", u)
		}
		if strings.Contains(err.Error(), "s3") {
			t.Errorf("error names the secret: %v", err)
		}
	}
}
