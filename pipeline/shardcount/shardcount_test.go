package shardcount_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/shardcount"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

func dynamo(t *testing.T) *store.DynamoDB {
	d := testenv.StartDynalite(t)
	return store.NewDynamoDB(d.Client(), d.Table(t, "shards"), store.NewMetrics(prometheus.NewRegistry()))
}

// TestRacingRaisesAgree: sidecars throttled on the same topic at the same
// moment raise it once, to one agreed count, not once each.
func TestRacingRaisesAgree(t *testing.T) {
	st := dynamo(t)
	ctx := context.Background()
	var books []*shardcount.Book
	for range 4 {
		b := shardcount.New(shardcount.Config{Adaptive: true, Max: 64}, st, zaptest.NewLogger(t), prometheus.NewRegistry(), time.Now)
		if n, err := b.WriteCounts(ctx, []string{"hot"}); err != nil || n["hot"] != 1 {
			t.Fatalf("WriteCounts of a new topic = %v, %v; want 1 shard", n, err)
		}
		books = append(books, b)
	}
	var wg sync.WaitGroup
	got := make([]int, len(books))
	for i, b := range books {
		wg.Go(func() { got[i] = b.Throttled(ctx, "hot") })
	}
	wg.Wait()
	metas, err := st.Metas(ctx, []string{"hot"})
	if err != nil {
		t.Fatal(err)
	}
	if m := metas["hot"]; m.Shards != 2 || m.ReadShards != 2 {
		t.Errorf("after 4 racing raises: %+v, want 2 shards (one raise)", m)
	}
	for i, n := range got {
		if n != 2 {
			t.Errorf("book %d writes to %d shards, want the agreed 2", i, n)
		}
	}
	// Each book remembers the raise, made here or found made by another:
	// the console shows the history.
	made := 0
	for i, b := range books {
		h := b.History("hot")
		if len(h) != 1 || h[0].From != 1 || h[0].To != 2 {
			t.Errorf("book %d's history of hot = %+v, want the one raise 1→2", i, h)
			continue
		}
		if h[0].Here {
			made++
		}
	}
	if made > 1 {
		t.Errorf("%d books say they made the one raise", made)
	}
}

// TestRaisesFollowTheClock: with a stepped clock, a book trusts its copy of
// a topic's count for one cache period (another sidecar's raise shows after
// it), raises a topic at most once per period, and keeps an hour of raise
// history.
func TestRaisesFollowTheClock(t *testing.T) {
	st := dynamo(t)
	ctx := context.Background()
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	const every = 30 * time.Second
	cfg := shardcount.Config{Adaptive: true, Max: 64, Every: every}
	reg := prometheus.NewRegistry()
	b := shardcount.New(cfg, st, zaptest.NewLogger(t), reg, clk.Now)
	if n, err := b.WriteCounts(ctx, []string{"hot"}); err != nil || n["hot"] != 1 {
		t.Fatalf("WriteCounts of a new topic = %v, %v; want 1 shard", n, err)
	}
	if n := b.Throttled(ctx, "hot"); n != 2 {
		t.Fatalf("first raise: %d shards, want 2", n)
	}
	clk.Add(every - time.Second)
	if n := b.Throttled(ctx, "hot"); n != 2 {
		t.Errorf("a second raise within the period: %d shards, want 2", n)
	}
	clk.Add(2 * time.Second)
	if n, err := b.WriteCounts(ctx, []string{"hot"}); err != nil || n["hot"] != 2 { // as the next flush does
		t.Fatalf("WriteCounts after the period = %v, %v; want 2", n, err)
	}
	if n := b.Throttled(ctx, "hot"); n != 4 {
		t.Errorf("a raise after the period: %d shards, want 4", n)
	}
	if n := testenv.Metric(t, reg, "hotcount_shards_raised_total"); n != 2 {
		t.Errorf("raised_total = %v, want 2", n)
	}

	// Another sidecar raises hot to 8: this book keeps writing with its
	// copy until the period ends, then follows.
	if _, _, err := shardcount.Set(ctx, st, "hot", 8); err != nil {
		t.Fatal(err)
	}
	clk.Add(every - time.Second)
	if n, err := b.WriteCounts(ctx, []string{"hot"}); err != nil || n["hot"] != 4 {
		t.Errorf("WriteCounts within the period = %v, %v; want the cached 4", n, err)
	}
	if n := b.Cached("hot"); n != 4 {
		t.Errorf("Cached = %d, want 4", n)
	}
	clk.Add(2 * time.Second)
	if n, err := b.WriteCounts(ctx, []string{"hot"}); err != nil || n["hot"] != 8 {
		t.Errorf("WriteCounts after the period = %v, %v; want 8, read again", n, err)
	}

	if h := b.History("hot"); len(h) != 2 || h[0].To != 2 || h[1].To != 4 || !h[1].Here || !h[1].At.Equal(clk.Now().Add(-every-time.Second)) {
		t.Errorf("history = %+v, want the raises to 2 and 4, made here, at the clock's time", h)
	}
	clk.Add(time.Hour)
	if h := b.History("hot"); len(h) != 0 {
		t.Errorf("history an hour later = %+v, want none", h)
	}
}

// TestStaticTopicsKeepTheirCount: a topic first written under --shards 4
// keeps 4 when the default becomes 8 or 2; a new topic takes the default of
// its first writer; one-shard topics have no metadata row.
func TestStaticTopicsKeepTheirCount(t *testing.T) {
	st := dynamo(t)
	ctx := context.Background()
	four := shardcount.New(shardcount.Config{Default: 4, Max: 64}, st, zaptest.NewLogger(t), prometheus.NewRegistry(), time.Now)
	if n, err := four.WriteCounts(ctx, []string{"a"}); err != nil || n["a"] != 4 {
		t.Fatalf("%v, %v", n, err)
	}
	for _, def := range []int{8, 2} {
		b := shardcount.New(shardcount.Config{Default: def, Max: 64}, st, zaptest.NewLogger(t), prometheus.NewRegistry(), time.Now)
		n, err := b.WriteCounts(ctx, []string{"a", "new" + string(rune('0'+def))})
		if err != nil {
			t.Fatal(err)
		}
		if n["a"] != 4 || n["new"+string(rune('0'+def))] != def {
			t.Errorf("default %d: counts %v, want a kept at 4, the new topic at %d", def, n, def)
		}
	}
	one := shardcount.New(shardcount.Config{Default: 1, Max: 64}, st, zaptest.NewLogger(t), prometheus.NewRegistry(), time.Now)
	if _, err := one.WriteCounts(ctx, []string{"quiet"}); err != nil {
		t.Fatal(err)
	}
	if m, _ := st.Metas(ctx, []string{"quiet"}); m["quiet"].Exists() {
		t.Error("a one-shard topic got a metadata row")
	}
}

// TestSetNeverShrinksTheReadSet: an operator lowers a topic; writes go to
// fewer shards, reads still cover every shard it ever had.
func TestSetNeverShrinksTheReadSet(t *testing.T) {
	st := dynamo(t)
	ctx := context.Background()
	if _, after, err := shardcount.Set(ctx, st, "t", 8); err != nil || after.Write() != 8 {
		t.Fatalf("Set 8 = %+v, %v", after, err)
	}
	if err := st.Add(ctx, testenv.W("t", 7, 3), time.Now()); err != nil {
		t.Fatal(err)
	}
	before, after, err := shardcount.Set(ctx, st, "t", 2)
	if err != nil || before.Write() != 8 || after.Write() != 2 || after.Read() != 8 {
		t.Fatalf("Set 2 = %+v -> %+v, %v; want writes on 2, reads of 8", before, after, err)
	}
	got, err := st.Gather(ctx, "t", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if sum, _ := schema.Sum(got); sum != 3 {
		t.Errorf("sum %d after lowering, want 3: the count in shard 7 is still read", sum)
	}
	if _, _, err := shardcount.Set(ctx, st, "t", 0); err == nil {
		t.Error("Set 0 accepted")
	}
}
