package lookup_test

import (
	"context"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/schema"
)

// guard bounds a test's wait for an event that should come at once.
const guard = 10 * time.Second

// newView returns svc's view of a writer's writes, which the test tells
// of them as the writer would.
func newView(svc *lookup.Service, cfg lookup.Config) *ownwrites.View {
	v := ownwrites.New(lookup.ViewConfig(cfg), time.Now)
	svc.SeeWrites(v)
	return v
}

// answer is a lookup's.
type answer struct {
	total lookup.Total
	err   error
}

// lookupAsync looks topic up on a goroutine of its own.
func lookupAsync(svc *lookup.Service, topic string) <-chan answer {
	res := make(chan answer, 1)
	go func() {
		t, err := svc.Lookup(context.Background(), topic, lookup.Cached)
		res <- answer{t, err}
	}()
	return res
}

// count waits up to within for the lookup's answer, its count.
func count(t *testing.T, res <-chan answer, within time.Duration) int64 {
	t.Helper()
	select {
	case a := <-res:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a.total.Count
	case <-time.After(within):
		t.Fatalf("the lookup did not return within %s", within)
		return 0
	}
}

// serviceConfig is newService's.
var serviceConfig = lookup.Config{Shards: 4, CacheTTL: time.Minute, CacheStale: time.Minute, CacheSize: 100, MaxTopicBytes: 32}

// TestLookupWaitsForAWriteToLand: a gather that finds a write of its
// topic on its way waits for it to land and reads again: the answer holds
// the write, whether it landed before the gather, during it or after it.
func TestLookupWaitsForAWriteToLand(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "golang", 0, 5)
	st.gate = make(chan struct{})
	svc, _ := newService(t, st, time.Minute, time.Minute, nil)
	v := newView(svc, serviceConfig)
	sent := v.Sent("golang")

	res := lookupAsync(svc, "golang")
	st.gate <- struct{}{} // the first gather: 5, with the write on its way
	add(t, b, "golang", 1, 3)
	v.Answered([]ownwrites.Answer{{Topic: "golang", Delta: 3, Sent: sent, Outcome: ownwrites.Applied}})
	close(st.gate)
	if got := count(t, res, guard); got != 8 {
		t.Errorf("count = %d, want 8, the landed write's included", got)
	}
	if n := st.consistent.Load(); n != 1 {
		t.Errorf("%d strong gathers, want 1: the gather again once the write landed", n)
	}
}

// TestLookupWaitsForAWriteThatDoesNotLand: a write that stops being on
// its way without landing (in doubt, refused) ends the wait too.
func TestLookupWaitsForAWriteThatDoesNotLand(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "golang", 0, 5)
	st.gate = make(chan struct{})
	svc, _ := newService(t, st, time.Minute, time.Minute, nil)
	v := newView(svc, serviceConfig)
	sent := v.Sent("golang")

	res := lookupAsync(svc, "golang")
	st.gate <- struct{}{}
	v.Answered([]ownwrites.Answer{{Topic: "golang", Delta: 3, Sent: sent, Outcome: ownwrites.Refused}})
	close(st.gate)
	if got := count(t, res, guard); got != 5 {
		t.Errorf("count = %d, want 5", got)
	}
}

// TestCachedTotalCountsLandedWrites: a cached total counts a write of
// this sidecar sent after its gather as soon as it lands, without a
// gather; a write that raced the gather (sent before it ended, landed
// after it began) makes the next reader gather again, and a write that
// landed before the gather began is not counted twice.
func TestCachedTotalCountsLandedWrites(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "golang", 0, 5)
	svc, _ := newService(t, st, time.Minute, time.Minute, nil)
	v := newView(svc, serviceConfig)
	ctx := context.Background()
	lookupCount := func() int64 {
		t.Helper()
		got, err := svc.Lookup(ctx, "golang", lookup.Cached)
		if err != nil {
			t.Fatal(err)
		}
		return got.Count
	}
	if got := lookupCount(); got != 5 {
		t.Fatalf("first lookup: %d, want 5", got)
	}
	calls := st.calls.Load()

	sent := time.Now() // after the gather ended
	add(t, b, "golang", 1, 3)
	v.Answered([]ownwrites.Answer{{Topic: "golang", Delta: 3, Sent: sent, Outcome: ownwrites.Applied}})
	for range 2 { // raised once, then kept raised
		if got := lookupCount(); got != 8 {
			t.Errorf("after a landing: %d, want 8", got)
		}
	}
	if st.calls.Load() != calls {
		t.Errorf("%d gathers for a landing, want none", st.calls.Load()-calls)
	}

	// A write sent before the cached gather ended: it may or may not be
	// in it, so the next reader gathers.
	add(t, b, "golang", 2, 4)
	v.Answered([]ownwrites.Answer{{Topic: "golang", Delta: 4, Sent: sent.Add(-time.Hour), Outcome: ownwrites.Applied}})
	if got := lookupCount(); got != 12 {
		t.Errorf("after a racing landing: %d, want 12", got)
	}
	if st.calls.Load() == calls {
		t.Error("a racing landing was counted without a gather")
	}
}

// TestBatchLandingWhileAnotherTopicSettles: in a batch gather, a write of
// one topic that lands while the gather waits for another topic's write
// is counted: only the topic read again began later (an outside review
// found every topic of the batch taken to have begun then, and the
// landing taken to be in a read made before it).
func TestBatchLandingWhileAnotherTopicSettles(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "a", 0, 1)
	add(t, b, "x", 0, 5)
	st.gate = make(chan struct{})
	svc, _ := newService(t, st, time.Minute, time.Minute, nil)
	v := newView(svc, serviceConfig)
	sentA := v.Sent("a")

	res := make(chan []lookup.Total, 1)
	go func() {
		ts, err := svc.LookupMany(context.Background(), []string{"a", "x"}, lookup.Cached)
		if err != nil {
			t.Error(err)
		}
		res <- ts
	}()
	st.gate <- struct{}{} // the batch's first gather: a 1, x 5
	add(t, b, "x", 1, 3)  // x's write lands while the gather waits for a's
	v.Answered([]ownwrites.Answer{{Topic: "x", Delta: 3, Sent: time.Now(), Outcome: ownwrites.Applied}})
	add(t, b, "a", 1, 2)
	v.Answered([]ownwrites.Answer{{Topic: "a", Delta: 2, Sent: sentA, Outcome: ownwrites.Applied}})
	close(st.gate)
	var ts []lookup.Total
	select {
	case ts = <-res:
	case <-time.After(guard):
		t.Fatalf("the batch lookup did not return within %s", guard)
	}
	if len(ts) != 2 || ts[0].Count != 3 || ts[1].Count != 8 {
		t.Errorf("counts %+v, want a 3 and x 8", ts)
	}
	for range 2 {
		got, err := svc.Lookup(context.Background(), "x", lookup.Cached)
		if err != nil || got.Count != 8 {
			t.Errorf("x cached: %d (%v), want 8", got.Count, err)
		}
	}
}

// racedStore is a store whose reads a writer races: before each read,
// race may send a write, and land it after the read.
type racedStore struct {
	lookup.Store
	race func(read int) (land func())
	n    int // reads so far; one gather at a time in the test
}

func (r *racedStore) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	r.n++
	land := r.race(r.n)
	m, err := r.Store.GatherMany(ctx, topics, n, consistent)
	if land != nil {
		go land() // as the writer would: its answer comes while the reader looks
	}
	return m, err
}

// TestPendingWaitsPastTheLastRace: a gather whose every read a new write
// races gives up after a few reads and keeps what it read, with a write
// still on its way that the read may or may not hold. The answer with
// pending mentions does not take it to be there: it reads again at the
// same consistency, and counts every mention this sidecar sent. (It took
// the write to be in the total, and a read on a starved core answered
// below what was accepted.)
func TestPendingWaitsPastTheLastRace(t *testing.T) {
	for name, c := range map[string]lookup.Consistency{"cached": lookup.Cached, "eventual": lookup.Eventual, "strong": lookup.Strong} {
		t.Run(name, func(t *testing.T) { pendingPastTheLastRace(t, c) })
	}
}

func pendingPastTheLastRace(t *testing.T, c lookup.Consistency) {
	b := newBolt(t)
	add(t, b, "golang", 0, 5)
	st := &racedStore{Store: b}
	svc, _ := newService(t, st, time.Minute, time.Minute, nil)
	v := newView(svc, serviceConfig)
	write := func(shard int) (land func()) {
		sent := v.Sent("golang")
		return func() {
			// On the writer's goroutine: an error fails the test, but
			// the answer comes whatever happens, as the writer's would.
			if err := b.Add(context.Background(), testenv.W("golang", shard, 1), time.Now()); err != nil {
				t.Error(err)
			}
			v.Answered([]ownwrites.Answer{{Topic: "golang", Delta: 1, Sent: sent, Outcome: ownwrites.Applied}})
		}
	}
	var third func() // the write left on its way
	st.race = func(read int) func() {
		switch {
		case read < 3: // raced, and landed after the read
			return write(read)
		case read == 3: // raced, and left on its way
			third = write(read)
		case third != nil: // the next gather: it lands as this read begins
			third()
			third = nil
		}
		return nil
	}
	ctx := context.Background()
	tot, err := svc.Lookup(ctx, "golang", c)
	if err != nil {
		t.Fatal(err)
	}
	if tot.Count != 7 || !v.OnItsWay("golang") {
		t.Fatalf("after three raced reads: %d, on its way %v; want 7 (two writes landed), the third on its way", tot.Count, v.OnItsWay("golang"))
	}
	svc.WithPending(ctx, &tot)
	if tot.Count != 8 || st.n < 4 {
		t.Errorf("with pending: %d after %d reads, want 8 (every write sent) after a fourth", tot.Count, st.n)
	}
}
