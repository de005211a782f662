package lookup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/store"
)

// TestAgainstDynamoDB runs batch lookups and the three consistency levels
// against dynalite: 30 topics × 4 shards is 120 keys, two BatchGetItem calls.
func TestAgainstDynamoDB(t *testing.T) {
	d := testenv.StartDynalite(t)
	reg := prometheus.NewRegistry()
	st := store.NewDynamoDB(d.Client(), d.Table(t, "lookup"), store.NewMetrics(reg))
	ctx := context.Background()
	var topics []string
	for i := range 30 {
		topic := fmt.Sprintf("t%d", i)
		topics = append(topics, topic)
		if err := st.Add(ctx, testenv.W(topic, i%4, int64(i+1)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	svc, _ := newService(t, st, time.Minute, time.Hour, nil)
	got, err := svc.LookupMany(ctx, topics, lookup.Cached)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		if g.Topic != topics[i] || g.Count != int64(i+1) || g.Source != "store" {
			t.Errorf("batch result %d = %+v, want %s = %d", i, g, topics[i], i+1)
		}
	}
	if n := testenv.Metric(t, reg, "hotcount_store_batch_gets_total"); n != 2 {
		t.Errorf("%v BatchGetItem calls for 120 keys, want 2", n)
	}
	again, err := svc.LookupMany(ctx, topics, lookup.Cached)
	if err != nil {
		t.Fatal(err)
	}
	if again[29].Source != "cache" || testenv.Metric(t, reg, "hotcount_store_batch_gets_total") != 2 {
		t.Errorf("second batch went to the store: %+v", again[29])
	}

	if err := st.Add(ctx, testenv.W("t0", 3, 10), time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    lookup.Consistency
		want int64
	}{{lookup.Cached, 1}, {lookup.Eventual, 11}, {lookup.Strong, 11}} {
		g, err := svc.Lookup(ctx, "t0", tc.c)
		if err != nil || g.Count != tc.want {
			t.Errorf("consistency %d: %+v, %v; want %d", tc.c, g, err, tc.want)
		}
	}
}
