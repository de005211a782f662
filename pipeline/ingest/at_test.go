package ingest_test

import (
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/schema"
)

// timedSink records what the subscriber accepted, with the time of those
// given one.
type timedSink struct {
	sink
	mu sync.Mutex
	at map[string][]time.Time
}

func (s *timedSink) AddAt(topic string, delta int64, at time.Time) {
	s.sink.Add(topic, delta)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at[topic] = append(s.at[topic], at)
}

// TestAtReachesTheSink: in core mode a mention's "at" goes to a TimedSink
// as its time, to the millisecond; a mention without one goes through Add;
// an "at" past the bound is rejected under reason "at". A sink that takes
// no times gets the mentions with one through Add.
func TestAtReachesTheSink(t *testing.T) {
	ns := testenv.NATS(t)
	at := time.Now().Add(-5 * time.Hour).Truncate(time.Millisecond)
	publish := func() {
		pub := testenv.Connect(t, ns.ClientURL())
		must(t, pub.Publish("mentions.timed", fmt.Appendf(nil, `{"count":2,"at":%d}`, at.UnixMilli())))
		must(t, pub.Publish("mentions.timed", fmt.Appendf(nil, `{"count":1,"at":%q}`, at.Format(time.RFC3339Nano))))
		must(t, pub.Publish("mentions.untimed", nil))
		must(t, pub.Publish("mentions.late", fmt.Appendf(nil, `{"count":1,"at":%d}`, time.Now().Add(-25*time.Hour).UnixMilli())))
		must(t, pub.Flush())
	}
	for _, timed := range []bool{true, false} {
		t.Run(fmt.Sprint("timed=", timed), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			k := &timedSink{sink: sink{counts: map[string]int64{}}, at: map[string][]time.Time{}}
			var s ingest.Sink = k
			if !timed {
				s = &k.sink
			}
			_, stop, done := newSubscriber(t, ns.ClientURL(), reg, s)
			defer func() { stop(); <-done }()
			publish()
			testenv.Eventually(t, 5*time.Second, func() error {
				if n := testenv.MetricWith(t, reg, "hotcount_ingest_invalid_total", "reason", mention.ReasonAt); n != 1 {
					return fmt.Errorf("%v rejected for their at, want 1", n)
				}
				if n := testenv.Metric(t, reg, "hotcount_ingest_events_total"); n != 3 {
					return fmt.Errorf("%v accepted, want 3", n)
				}
				return nil
			})
			if got := k.snapshot(); got["timed"] != 3 || got["untimed"] != 1 || len(got) != 2 {
				t.Errorf("accepted %v, want timed:3 untimed:1", got)
			}
			k.mu.Lock()
			defer k.mu.Unlock()
			switch ts := k.at["timed"]; {
			case !timed && len(k.at) != 0:
				t.Errorf("times %v given to a sink that takes none", k.at)
			case timed && (len(ts) != 2 || !ts[0].Equal(at) || !ts[1].Equal(at) || len(k.at) != 1):
				t.Errorf("times %v, want timed at %v twice and nothing else", k.at, at)
			}
		})
	}
}

// TestAtIsJudgedByTheSinksClock: in core mode a mention's "at" is judged
// against the clock the aggregator places mentions by, not the wall
// clock. With a fake clock a month behind, an "at" five hours before the
// fake now is taken and counted in its own minute, a mention without one
// in the fake now's minute, and an "at" of the wall clock's now (a month
// ahead of the fake one) is refused.
func TestAtIsJudgedByTheSinksClock(t *testing.T) {
	ns := testenv.NATS(t)
	clk := testenv.NewClock(time.Now().AddDate(0, -1, 0).Truncate(time.Millisecond))
	reg := prometheus.NewRegistry()
	agg := aggregator.New(100, prometheus.NewRegistry(), aggregator.WithBuckets(clk.Now))
	_, stop, done := newSubscriber(t, ns.ClientURL(), reg, agg)
	defer func() { stop(); <-done }()
	at := clk.Now().Add(-5 * time.Hour)
	pub := testenv.Connect(t, ns.ClientURL())
	must(t, pub.Publish("mentions.timed", fmt.Appendf(nil, `{"count":2,"at":%d}`, at.UnixMilli())))
	must(t, pub.Publish("mentions.untimed", nil))
	must(t, pub.Publish("mentions.wall", fmt.Appendf(nil, `{"count":1,"at":%d}`, time.Now().UnixMilli())))
	must(t, pub.Flush())
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := testenv.MetricWith(t, reg, "hotcount_ingest_invalid_total", "reason", mention.ReasonAt); n != 1 {
			return fmt.Errorf("%v rejected for their at, want 1 (the wall clock's now)", n)
		}
		if n := testenv.Metric(t, reg, "hotcount_ingest_events_total"); n != 2 {
			return fmt.Errorf("%v accepted, want 2", n)
		}
		return nil
	})
	minute := func(topic string, t time.Time) string {
		return schema.Counter{Topic: topic, Kind: schema.Fresh, Index: schema.Minute.Index(t)}.Name()
	}
	want := map[string]int64{minute("timed", at): 2, minute("untimed", clk.Now()): 1}
	if got := agg.Drain().Deltas.Map(); !maps.Equal(got, want) {
		t.Errorf("window %v, want %v", got, want)
	}
}
