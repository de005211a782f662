package flusher_test

import (
	"context"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/quarantine"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// deny makes the store refuse for good every write of the topics named
// (all of them when none is).
func (f *faulty) deny(topics ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.denied = func(c schema.Counter) bool {
		for _, t := range topics {
			if c.Topic == t {
				return true
			}
		}
		return len(topics) == 0
	}
}

func (f *faulty) allow() { f.mu.Lock(); f.denied = nil; f.mu.Unlock() }

// quarantined is a fixture whose flusher quarantines after a minute of
// refusals, into a folder of its own, on a clock the test steps.
func quarantined(t *testing.T) (*fixture, *quarantine.Dir, *testenv.Clock) {
	t.Helper()
	clock := testenv.NewClock(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	q, err := quarantine.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := cfg
	c.QuarantineAfter = time.Minute
	return newFixture(t, c, clock.Now, flusher.WithQuarantine(q)), q, clock
}

// replay runs hotcount quarantine replay's function against the
// fixture's store.
func replay(ctx context.Context, q quarantine.Store, fx *fixture, clock *testenv.Clock) (quarantine.Result, error) {
	return quarantine.Replay(ctx, q, fx.st, store.NewSequencer(clock.Now), store.NewWriterID, clock.Now)
}

// TestQuarantineMovesAPoisonTopicAside (core mode): a topic whose writes
// are refused for good keeps its delta in the buffer until the bound has
// passed, then its delta, and only it, goes to the quarantine, exactly,
// while the other topics are written throughout; a replay once the store
// takes it again writes it once, and a second replay finds nothing.
func TestQuarantineMovesAPoisonTopicAside(t *testing.T) {
	ctx := context.Background()
	fx, q, clock := quarantined(t)
	fx.st.deny("poison")

	held := func() []quarantine.Entry {
		es, err := q.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	fx.agg.Add("poison", 5)
	fx.agg.Add("ok", 3)
	fx.fl.Flush(ctx) //nolint:errcheck // poison's write fails: the error says so
	clock.Add(40 * time.Second)
	fx.agg.Add("poison", 2)
	fx.agg.Add("ok", 1)
	fx.fl.Flush(ctx) //nolint:errcheck
	if es := held(); len(es) != 0 {
		t.Fatalf("quarantined before --quarantine-after: %+v", es)
	}
	if got := fx.agg.Pending("poison"); got != 7 {
		t.Fatalf("poison's buffered delta = %d, want 7", got)
	}
	clock.Add(30 * time.Second)
	fx.agg.Add("ok", 1)
	if err := fx.fl.Flush(ctx); err != nil {
		t.Fatalf("the flush that quarantines poison = %v, want nil: nothing is left to write", err)
	}
	es := held()
	if len(es) != 1 || es[0].Topic != "poison" || es[0].Delta != 7 || es[0].Counter != schema.TotalOf("poison").Name() {
		t.Fatalf("quarantine holds %+v, want poison's total with 7", es)
	}
	if es[0].Reason == "" || !es[0].Since.Equal(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)) {
		t.Fatalf("entry's reason %q since %v: want the refusal, since the first one", es[0].Reason, es[0].Since)
	}
	if got := fx.agg.Pending("poison"); got != 0 {
		t.Fatalf("poison's buffered delta after the quarantine = %d, want 0", got)
	}
	if got := fx.total(t, "ok", 4); got != 5 {
		t.Fatalf("ok = %d, want 5: the other topics are written throughout", got)
	}
	if got := testenv.Metric(t, fx.reg, "hotcount_flusher_quarantined_mentions_total"); got != 7 {
		t.Fatalf("hotcount_flusher_quarantined_mentions_total = %v, want 7", got)
	}
	// Still refused, its next write goes at once, not after another
	// bound: a hot poison topic would hold its deltas every bound.
	fx.agg.Add("poison", 2)
	fx.fl.Flush(ctx) //nolint:errcheck // refused, then quarantined
	if es := held(); len(es) != 2 || fx.agg.Pending("poison") != 0 {
		t.Fatalf("after poison's next refusal the quarantine holds %+v (buffered %d); want its 2 there at once", es, fx.agg.Pending("poison"))
	}
	// The topic's later mentions are written normally once the store
	// takes them; the quarantined ones wait for the replay.
	fx.st.allow()
	fx.agg.Add("poison", 4)
	if err := fx.fl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fx.total(t, "poison", 4); got != 4 {
		t.Fatalf("poison = %d before the replay, want 4", got)
	}
	r, err := replay(ctx, q, fx, clock)
	if err != nil || len(r.Written) != 2 || len(r.Left) != 0 || r.Mentions() != 9 {
		t.Fatalf("Replay = %+v, %v; want poison's two entries written", r, err)
	}
	if got := fx.total(t, "poison", 4); got != 13 {
		t.Fatalf("poison = %d after the replay, want 13", got)
	}
	if r, err := replay(ctx, q, fx, clock); err != nil || len(r.Written)+len(r.Left) != 0 {
		t.Fatalf("second Replay = %+v, %v; want nothing to do", r, err)
	}
}

// TestQuarantineTakesAStoreThatRefusesEverything: when every write is
// refused for good (a role that lost its grant), the flusher makes
// progress (the store answers: liveness does not restart the sidecar),
// and after the bound every counter is quarantined, exactly, rather than
// hold every topic's deltas until someone fixes it; the replay then
// writes it all.
func TestQuarantineTakesAStoreThatRefusesEverything(t *testing.T) {
	ctx := context.Background()
	fx, q, clock := quarantined(t)
	fx.st.deny()
	for range 3 {
		fx.agg.Add("a", 1)
		fx.agg.Add("b", 2)
		fx.fl.Flush(ctx) //nolint:errcheck // every write is refused
		if !fx.fl.LastProgress().Equal(clock.Now()) {
			t.Fatalf("last progress %v after a flush refused only for good, want now %v", fx.fl.LastProgress(), clock.Now())
		}
		clock.Add(30 * time.Second)
	}
	es, err := q.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int64{}
	for _, e := range es {
		held[e.Topic] += e.Delta
	}
	if held["a"] != 3 || held["b"] != 6 || fx.agg.Pending("a")+fx.agg.Pending("b") != 0 {
		t.Fatalf("quarantine holds %v (buffer a=%d b=%d); want a=3 b=6 held, none buffered", held, fx.agg.Pending("a"), fx.agg.Pending("b"))
	}
	fx.st.allow()
	if _, err := replay(ctx, q, fx, clock); err != nil {
		t.Fatal(err)
	}
	if a, b := fx.total(t, "a", 4), fx.total(t, "b", 4); a != 3 || b != 6 {
		t.Fatalf("after the replay a=%d b=%d, want 3 and 6", a, b)
	}
}

// TestQuarantineNeverTakesAWriteInDoubt: a write whose answer was lost
// (it may be in the store) and whose resends are then refused for good
// stays pending however long it lasts: a replay under another identity
// could count it twice. Once the store takes it again it settles, once.
func TestQuarantineNeverTakesAWriteInDoubt(t *testing.T) {
	ctx := context.Background()
	fx, q, clock := quarantined(t)
	fx.st.loseFirst = true // applied, its answer lost
	fx.agg.Add("x", 5)
	fx.fl.Flush(ctx) //nolint:errcheck // in doubt
	fx.st.deny("x")
	for range 4 {
		clock.Add(time.Minute)
		fx.agg.Add("y", 1) // the store takes others meanwhile
		fx.fl.Flush(ctx)   //nolint:errcheck // x's resend is refused
	}
	if es, err := q.List(ctx); err != nil || len(es) != 0 {
		t.Fatalf("quarantine holds %+v, %v; want nothing: x's write may be in the store", es, err)
	}
	if got := testenv.Metric(t, fx.reg, "hotcount_flusher_pending_writes"); got != 1 {
		t.Fatalf("pending writes = %v, want x's", got)
	}
	fx.st.allow()
	if err := fx.fl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fx.total(t, "x", 4); got != 5 {
		t.Fatalf("x = %d, want 5, once", got)
	}
}
