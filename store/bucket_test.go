package store_test

import (
	"context"
	"errors"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/store"
)

// TestBucketKeys: bucket keys and counter names round-trip for topics with
// '#', digits and the other kinds' prefixes in them, and never meet a
// total's key.
func TestBucketKeys(t *testing.T) {
	at := time.Date(2026, 12, 3, 8, 59, 30, 0, time.UTC)
	m, h := store.Minute.Index(at), store.Hour.Index(at)
	if got := store.Minute.Start(m); !got.Equal(at.Truncate(time.Minute)) {
		t.Errorf("minute %d starts %v, want %v", m, got, at.Truncate(time.Minute))
	}
	if got := store.Hour.Start(h); !got.Equal(at.Truncate(time.Hour)) {
		t.Errorf("hour %d starts %v, want %v", h, got, at.Truncate(time.Hour))
	}
	for _, topic := range []string{"golang", "a#1", "x#m5#0", "MINUTE#y", "3", "TREND#z#meta"} {
		for _, g := range []store.Granularity{store.Minute, store.Hour} {
			pk := store.BucketKey(topic, g, 29_000_123, 7)
			gotTopic, gotG, i, shard, err := store.ParseBucketKey(pk)
			if err != nil || gotTopic != topic || gotG != g || i != 29_000_123 || shard != 7 {
				t.Errorf("ParseBucketKey(%q) = %q %c %d %d %v", pk, gotTopic, gotG, i, shard, err)
			}
			if _, _, err := store.ParseShardKey(pk); err == nil {
				t.Errorf("bucket key %q parses as a total's shard key", pk)
			}
			name := store.BucketCounter(topic, g, 42)
			if !store.IsBucket(name) || store.TopicOf(name) != topic {
				t.Errorf("counter %q: IsBucket %v, TopicOf %q", name, store.IsBucket(name), store.TopicOf(name))
			}
			if err := store.ValidateTopic(name, 1024); err == nil {
				t.Errorf("a counter name %q passes as a topic: it could meet one", name)
			}
		}
		if store.IsBucket(topic) || store.TopicOf(topic) != topic {
			t.Errorf("topic %q reads as a bucket counter", topic)
		}
	}
	topic, minute, hour := store.SplitFresh(store.BucketCounter("golang", store.Fresh, m))
	if topic != "golang" || minute != store.BucketCounter("golang", store.Minute, m) || hour != store.BucketCounter("golang", store.Hour, h) {
		t.Errorf("SplitFresh = %q, %q, %q", topic, minute, hour)
	}
	if topic, minute, hour := store.SplitFresh(store.BucketCounter("golang", store.Minute, m)); topic != "" || minute != "" || hour != "" {
		t.Errorf("a minute counter splits again: %q, %q, %q", topic, minute, hour)
	}
	for _, i := range []int64{0, 1, 63, 64, m, h, 1<<30 - 1} {
		if _, _, got, ok := store.ParseCounter(store.BucketCounter("t", store.Minute, i)); !ok || got != i {
			t.Errorf("index %d reads back as %d, %v", i, got, ok)
		}
		if name := store.BucketCounter("t", store.Fresh, i); !utf8.ValidString(name) || !store.CountsMentions(name) || store.CountsMentions(store.BucketCounter("t", store.Hour, i)) {
			t.Errorf("counter %q: valid UTF-8 %v, counts mentions %v", name, utf8.ValidString(name), store.CountsMentions(name))
		}
	}
}

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
			counter := store.BucketCounter("golang", store.Minute, store.Minute.Index(now))
			w := store.Write{Topic: counter, Shard: 0, Delta: 5, Writer: "w1", Seq: 10}
			if err := st.Add(ctx, w, now); err != nil {
				t.Fatal(err)
			}
			w.Retry = true
			if err := st.Add(ctx, w, now); err != nil {
				t.Fatalf("retry of an applied bucket write: %v", err)
			}
			if err := st.Add(ctx, store.Write{Topic: "golang", Shard: 0, Delta: 2, Writer: "w1", Seq: 11}, now); err != nil {
				t.Fatal(err)
			}
			key := store.BucketKey("golang", store.Minute, store.Minute.Index(now), 0)
			got, err := st.Counts(ctx, []string{key, store.BucketKey("golang", store.Minute, store.Minute.Index(now)-1, 0)}, false)
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
