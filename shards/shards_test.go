package shards_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/shards"
	"github.com/hotcount/hotcount/store"
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
	var books []*shards.Book
	for range 4 {
		b := shards.New(shards.Config{Adaptive: true, Max: 64}, st, zaptest.NewLogger(t), prometheus.NewRegistry())
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

// TestStaticTopicsKeepTheirCount: a topic first written under --shards 4
// keeps 4 when the default becomes 8 or 2; a new topic takes the default of
// its first writer; one-shard topics have no metadata row.
func TestStaticTopicsKeepTheirCount(t *testing.T) {
	st := dynamo(t)
	ctx := context.Background()
	four := shards.New(shards.Config{Default: 4, Max: 64}, st, zaptest.NewLogger(t), prometheus.NewRegistry())
	if n, err := four.WriteCounts(ctx, []string{"a"}); err != nil || n["a"] != 4 {
		t.Fatalf("%v, %v", n, err)
	}
	for _, def := range []int{8, 2} {
		b := shards.New(shards.Config{Default: def, Max: 64}, st, zaptest.NewLogger(t), prometheus.NewRegistry())
		n, err := b.WriteCounts(ctx, []string{"a", "new" + string(rune('0'+def))})
		if err != nil {
			t.Fatal(err)
		}
		if n["a"] != 4 || n["new"+string(rune('0'+def))] != def {
			t.Errorf("default %d: counts %v, want a kept at 4, the new topic at %d", def, n, def)
		}
	}
	one := shards.New(shards.Config{Default: 1, Max: 64}, st, zaptest.NewLogger(t), prometheus.NewRegistry())
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
	if _, after, err := shards.Set(ctx, st, "t", 8); err != nil || after.Write() != 8 {
		t.Fatalf("Set 8 = %+v, %v", after, err)
	}
	if err := st.Add(ctx, testenv.W("t", 7, 3), time.Now()); err != nil {
		t.Fatal(err)
	}
	before, after, err := shards.Set(ctx, st, "t", 2)
	if err != nil || before.Write() != 8 || after.Write() != 2 || after.Read() != 8 {
		t.Fatalf("Set 2 = %+v -> %+v, %v; want writes on 2, reads of 8", before, after, err)
	}
	got, err := st.Gather(ctx, "t", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if sum, _ := store.Sum(got); sum != 3 {
		t.Errorf("sum %d after lowering, want 3: the count in shard 7 is still read", sum)
	}
	if _, _, err := shards.Set(ctx, st, "t", 0); err == nil {
		t.Error("Set 0 accepted")
	}
}
