package flusher_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/flusher"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/store"
)

// memJournal is a journal in memory: it records every entry whole and
// confirms at once. The real one (journal.Journal) needs JetStream; here the
// flusher's order of journaling, acknowledging and holding back is tested.
type memJournal struct {
	mu      sync.Mutex
	n       int
	entries map[string][]store.Write
}

func (j *memJournal) Record(ctx context.Context, writes []store.Write, seqs map[string][]int64) ([]journal.Recorded, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.n++
	k := "e" + strconv.Itoa(j.n)
	r := journal.Recorded{Key: k}
	for _, w := range writes {
		r.Counters = append(r.Counters, w.Counter)
	}
	j.entries[k] = append([]store.Write(nil), writes...)
	return []journal.Recorded{r}, nil
}
func (j *memJournal) Confirm(context.Context, string) (bool, error) { return true, nil }
func (j *memJournal) Rewrite(context.Context, string, store.Counter, int64) error {
	return nil
}
func (j *memJournal) MaybeReplayed(time.Time) bool { return false }
func (j *memJournal) Quarantine(context.Context, string, store.Counter) error {
	return nil
}
func (j *memJournal) Settled(context.Context, string) error { return nil }

// journaled is a flusher with minute and hour buckets and memJournal, on
// the embedded store whose writes of counter poison are all refused, and
// its aggregator on clock now.
func journaled(t *testing.T, now time.Time, poison store.Counter) (*store.Bolt, *aggregator.Aggregator, *memJournal, *flusher.Flusher) {
	reg := prometheus.NewRegistry()
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &faulty{Bolt: b, tried: map[store.Counter][]int{}, poison: poison}
	agg := aggregator.New(1000, reg, aggregator.WithBuckets(func() time.Time { return now }))
	j := &memJournal{entries: map[string][]store.Write{}}
	c := cfg
	c.Minutes, c.Hours = true, true
	return b, agg, j, flusher.New(c, agg, st, zaptest.NewLogger(t), flusher.NewMetrics(reg), time.Now, flusher.WithJournal(j))
}

// TestBucketHeldWithItsTopic: foo's minute bucket write keeps failing
// after it was journaled; a second message of foo in the same minute waits,
// unacknowledged, until every count of foo is journaled or written: had it
// been acknowledged with its total alone, a crash would lose its minute
// share.
func TestBucketHeldWithItsTopic(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 10, 0, time.UTC)
	min := store.Minute.Index(now)
	_, agg, j, fl := journaled(t, now, store.BucketOf("foo", store.Minute, min))
	ctx := context.Background()

	m1 := &heldMsg{}
	agg.AddAcked("foo", 1, m1, 1, now)
	t.Logf("flush 1: %v", fl.Flush(ctx)) // foo's total and hour land; its minute is refused and stays pending, journaled
	m2 := &heldMsg{}
	agg.AddAcked("foo", 1, m2, 2, now) // same minute
	t.Logf("flush 2: %v", fl.Flush(ctx))
	var minuteInJournal int64
	for k, ws := range j.entries {
		for _, w := range ws {
			t.Logf("entry %s: %+v +%d", k, w.Counter, w.Delta)
			if w.Counter == store.BucketOf("foo", store.Minute, min) {
				minuteInJournal += w.Delta
			}
		}
	}
	t.Logf("m1 acks %d, m2 acks %d; minute deltas journaled %d (2 messages)", m1.acks.Load(), m2.acks.Load(), minuteInJournal)
	if m2.acks.Load() > 0 && minuteInJournal < 2 {
		t.Errorf("m2 is acknowledged but its minute share is neither journaled nor written: a SIGKILL now loses it from the minute bucket")
	}
	if m1.acks.Load() != 1 {
		t.Errorf("m1, journaled whole, acknowledged %d times, want 1", m1.acks.Load())
	}
}

// TestNoBucketJournaledForAHeldMessage: foo's total keeps failing; a
// message of foo in the next minute is held back with its topic, and so is
// its minute's share: journaled or written while the message is still
// unacknowledged, a crash would redeliver the message and count it twice in
// the minute bucket.
func TestNoBucketJournaledForAHeldMessage(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 50, 0, time.UTC)
	b, agg, j, fl := journaled(t, now, store.TotalOf("foo"))
	ctx := context.Background()
	agg.AddAcked("foo", 1, &heldMsg{}, 1, now)
	fl.Flush(ctx)                      //nolint:errcheck // foo's total is refused: an error, by design
	later := now.Add(30 * time.Second) // the next minute
	m2 := &heldMsg{}
	agg.AddAcked("foo", 1, m2, 2, later)
	fl.Flush(ctx) //nolint:errcheck // as above
	next := store.BucketOf("foo", store.Minute, store.Minute.Index(later))
	var journaled int64
	for _, ws := range j.entries {
		for _, w := range ws {
			if w.Counter == next {
				journaled += w.Delta
			}
		}
	}
	got, _ := b.Counts(ctx, []string{store.BucketKey("foo", store.Minute, store.Minute.Index(later), 0), store.BucketKey("foo", store.Minute, store.Minute.Index(later), 1), store.BucketKey("foo", store.Minute, store.Minute.Index(later), 2), store.BucketKey("foo", store.Minute, store.Minute.Index(later), 3)}, false)
	var written int64
	for _, n := range got {
		written += n
	}
	t.Logf("m2 acks %d; its minute share journaled %d, written %d", m2.acks.Load(), journaled, written)
	if m2.acks.Load() == 0 && journaled > 0 {
		t.Errorf("m2 is unacknowledged (redelivered after a crash, counted again) but its minute share is journaled/written: the minute bucket counts it twice")
	}
}

// TestOutageKeepsMinutesWhole: while the store refuses everything, a flush
// tries Concurrency counters and hands the rest back as it came, one minute
// counter a topic (not split into three); once the store is back, every
// total, minute and hour is written once.
func TestOutageKeepsMinutesWhole(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 10, 0, time.UTC)
	reg := prometheus.NewRegistry()
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st := &faulty{Bolt: b, tried: map[store.Counter][]int{}, down: true}
	agg := aggregator.New(100_000, reg, aggregator.WithBuckets(func() time.Time { return now }))
	c := cfg
	c.Minutes, c.Hours = true, true
	fl := flusher.New(c, agg, st, zaptest.NewLogger(t), flusher.NewMetrics(reg), time.Now)
	ctx := context.Background()
	agg.Add("first", 1)
	fl.Flush(ctx) //nolint:errcheck // down: the first failure
	for i := range 1000 {
		agg.Add("t"+strconv.Itoa(i), 1)
	}
	fl.Flush(ctx) //nolint:errcheck // down: a probe
	if counters, mentions, _ := agg.Stats(); mentions != 1001 || counters > 1000+3+c.Concurrency*3 {
		t.Errorf("after a flush while down the buffer holds %d counters for 1,001 topics (%d mentions): split, not handed back whole", counters, mentions)
	}
	st.mu.Lock()
	st.down = false
	st.mu.Unlock()
	for range 3 {
		if fl.Flush(ctx) == nil {
			break
		}
	}
	for _, topic := range []string{"first", "t0", "t999"} {
		var minute, hour int64
		for shard := range c.Shards {
			keys := []string{store.BucketKey(topic, store.Minute, store.Minute.Index(now), shard), store.BucketKey(topic, store.Hour, store.Hour.Index(now), shard)}
			got, err := b.Counts(ctx, keys, false)
			if err != nil {
				t.Fatal(err)
			}
			minute, hour = minute+got[keys[0]], hour+got[keys[1]]
		}
		total, err := b.Gather(ctx, topic, c.Shards, false)
		if err != nil {
			t.Fatal(err)
		}
		if sum, _ := store.Sum(total); minute != 1 || hour != 1 || sum != 1 {
			t.Errorf("%s: minute %d, hour %d, total %d; want 1 each", topic, minute, hour, sum)
		}
	}
}
