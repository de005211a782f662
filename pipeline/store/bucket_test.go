package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// TestBucketWritesExactlyOnce: a bucket write is an idempotent Write like a
// total's: sent again after its answer was lost, it counts once, and its
// count reads back through Counts, apart from the topic's total.
func TestBucketWritesExactlyOnce(t *testing.T) {
	ctx := context.Background()
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			c, _ := open(t)
			st := c.(interface {
				counter
				Counts(ctx context.Context, keys []string, consistent bool) (map[string]int64, error)
			})
			now := time.Now()
			counter := schema.BucketOf("golang", schema.Minute, schema.Minute.Index(now))
			w := store.Write{Counter: counter, Shard: 0, Delta: 5, Writer: "w1", Seq: 10}
			if err := st.Add(ctx, w, now); err != nil {
				t.Fatal(err)
			}
			w.Retry = true
			if err := st.Add(ctx, w, now); err != nil {
				t.Fatalf("retry of an applied bucket write: %v", err)
			}
			if err := st.Add(ctx, store.Write{Counter: schema.TotalOf("golang"), Shard: 0, Delta: 2, Writer: "w1", Seq: 11}, now); err != nil {
				t.Fatal(err)
			}
			key := schema.BucketKey("golang", schema.Minute, schema.Minute.Index(now), 0)
			got, err := st.Counts(ctx, []string{key, schema.BucketKey("golang", schema.Minute, schema.Minute.Index(now)-1, 0)}, false)
			if err != nil {
				t.Fatal(err)
			}
			if got[key] != 5 || len(got) != 2 {
				t.Errorf("Counts = %v, want %s: 5 and the minute before 0", got, key)
			}
			total, err := st.Gather(ctx, "golang", 1, true)
			if err != nil || total[0].Count != 2 {
				t.Errorf("total %v (%v), want 2: buckets are not the total's shards", total, err)
			}
		})
	}
}

// TestEnableTTL: against dynalite, which has DescribeTimeToLive but not
// UpdateTimeToLive, EnableTTL says the endpoint lacks it (ErrNoTTL), which
// `table create` reports and goes past.
func TestEnableTTL(t *testing.T) {
	d := testenv.StartDynalite(t)
	_, err := store.EnableTTL(context.Background(), d.Client(), d.Table(t, "ttl"))
	if !errors.Is(err, store.ErrNoTTL) {
		t.Fatalf("EnableTTL on dynalite = %v, want ErrNoTTL", err)
	}
}

// TestHistoryMark: the fleet's history start is the earliest time any
// writer marked, in both stores; unmarked it is the zero time.
func TestHistoryMark(t *testing.T) {
	ctx := context.Background()
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			c, _ := open(t)
			st := c.(interface {
				HistoryStart(ctx context.Context) (time.Time, error)
				MarkHistory(ctx context.Context, t time.Time) error
			})
			if h, err := st.HistoryStart(ctx); err != nil || !h.IsZero() {
				t.Fatalf("unmarked history = %v, %v", h, err)
			}
			t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
			for _, at := range []time.Time{t0.Add(time.Hour), t0, t0.Add(2 * time.Hour)} {
				if err := st.MarkHistory(ctx, at); err != nil {
					t.Fatal(err)
				}
			}
			if h, err := st.HistoryStart(ctx); err != nil || !h.Equal(t0) {
				t.Errorf("history = %v, %v; want the earliest mark %v", h, err, t0)
			}
		})
	}
}
