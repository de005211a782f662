package flusher_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// faulty wraps the real embedded store with injected faults: down fails
// every write, throttleFirst refuses each topic's first write for
// throughput. It records the shards each topic's writes went to.
type faulty struct {
	*store.Bolt
	mu            sync.Mutex
	down          bool
	throttleFirst bool
	poison        schema.Counter            // a counter every write of which is refused (zero: none)
	denied        func(schema.Counter) bool // counters refused for good (store.ErrDenied); nil: none
	loseFirst     bool                      // each topic's first write is applied and its answer lost
	latency       time.Duration
	tried         map[schema.Counter][]int
	started       []time.Time // when each write began
}

var errDown = errors.New("injected: store down")

func (f *faulty) Add(ctx context.Context, w store.Write, now time.Time) error {
	f.mu.Lock()
	f.tried[w.Counter] = append(f.tried[w.Counter], w.Shard)
	f.started = append(f.started, time.Now())
	first := len(f.tried[w.Counter]) == 1
	down, throttle, latency := f.down || (f.poison != schema.Counter{} && w.Counter == f.poison), f.throttleFirst && first, f.latency
	lose := f.loseFirst && first
	denied := f.denied != nil && f.denied(w.Counter)
	f.mu.Unlock()
	if denied {
		return fmt.Errorf("injected: %w: AccessDeniedException", store.ErrDenied)
	}
	if lose {
		if err := f.Bolt.Add(ctx, w, now); err != nil {
			return err
		}
		return fmt.Errorf("%w: injected: answer lost after apply", store.ErrAmbiguous)
	}
	time.Sleep(latency) // a slow store: writes stay in flight
	switch {
	case down:
		return errDown
	case throttle:
		return fmt.Errorf("injected: %w", store.ErrThrottled)
	}
	return f.Bolt.Add(ctx, w, now)
}

func (f *faulty) set(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

type fixture struct {
	agg *aggregator.Aggregator
	st  *faulty
	fl  *flusher.Flusher
	reg *prometheus.Registry
}

func newFixture(t *testing.T, cfg flusher.Config, now func() time.Time, opts ...flusher.Option) *fixture {
	reg := prometheus.NewRegistry()
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if now == nil {
		now = time.Now
	}
	fx := &fixture{agg: aggregator.New(1000, reg), st: &faulty{Bolt: b, tried: map[schema.Counter][]int{}}, reg: reg}
	fx.fl = flusher.New(cfg, fx.agg, fx.st, zaptest.NewLogger(t), flusher.NewMetrics(reg), now, opts...)
	return fx
}

func (fx *fixture) total(t *testing.T, topic string, shards int) int64 {
	t.Helper()
	got, err := fx.st.Gather(context.Background(), topic, shards, false)
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := schema.Sum(got)
	return sum
}

var cfg = flusher.Config{Shards: 4, Interval: time.Hour, Timeout: time.Minute, Concurrency: 4}

// TestFailedFlushLosesNothing: while the store fails, flushes put every
// delta back; when it recovers, one flush writes them all, once.
func TestFailedFlushLosesNothing(t *testing.T) {
	fx := newFixture(t, cfg, nil)
	ctx := context.Background()
	fx.st.set(true)
	for i := range 30 {
		fx.agg.Add(fmt.Sprintf("t%d", i%10), 1)
	}
	for range 3 {
		err := fx.fl.Flush(ctx)
		if !errors.Is(err, errDown) {
			t.Fatalf("Flush while down = %v, want the store's error", err)
		}
		fx.agg.Add("t0", 1) // mentions keep arriving during the outage
	}
	if _, n := fx.agg.Stats(); n != 33 {
		t.Fatalf("buffer holds %d mentions after failed flushes, want 33", n)
	}
	fx.st.set(false)
	// The first flush after an outage probes the store with Concurrency
	// counters; the next takes the rest.
	var probed *flusher.ProbedError
	if err := fx.fl.Flush(ctx); !errors.As(err, &probed) || probed.Left == 0 || !errors.Is(err, flusher.ErrStoreDown) {
		t.Fatalf("first flush after the outage = %v, want a probe with counters left for the next flush", err)
	}
	_, left := fx.agg.Stats() // not tried by the probe: back in the buffer
	if err := fx.fl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var sum int64
	for i := range 10 {
		sum += fx.total(t, fmt.Sprintf("t%d", i), 4)
	}
	if sum != 33 || fx.total(t, "t0", 4) != 6 {
		t.Errorf("store holds %d (t0: %d), want 33 (t0: 6)", sum, fx.total(t, "t0", 4))
	}
	if _, n := fx.agg.Stats(); n != 0 {
		t.Errorf("buffer holds %d after a good flush, want 0", n)
	}
	if r := testenv.Metric(t, fx.reg, "hotcount_flusher_requeued_mentions_total"); r != float64(30+31+32+left) {
		t.Errorf("requeued = %v, want %d", r, 30+31+32+left)
	}
}

// TestThrottleMovesToAnotherShard: a throttled write is retried at once on
// a different shard, in the same flush.
func TestThrottleMovesToAnotherShard(t *testing.T) {
	fx := newFixture(t, cfg, nil)
	fx.st.throttleFirst = true
	for i := range 20 {
		fx.agg.Add(fmt.Sprintf("hot%d", i), 5)
	}
	if err := fx.fl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for c, shards := range fx.st.tried {
		if len(shards) != 2 || shards[0] == shards[1] {
			t.Errorf("%s: shards tried %v, want two different", c.Topic, shards)
		}
		if n := fx.total(t, c.Topic, 4); n != 5 {
			t.Errorf("%s: store holds %d, want 5", c.Topic, n)
		}
	}
	if n := testenv.Metric(t, fx.reg, "hotcount_flusher_rerouted_total"); n != 20 {
		t.Errorf("rerouted = %v, want 20", n)
	}
}

// TestDeadlineKeepsUnstartedWrites: past the flush deadline no write
// starts; the deltas stay buffered, not lost and not half-written.
func TestDeadlineKeepsUnstartedWrites(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	tick := 0
	clock := func() time.Time { // every reading is a second later
		mu.Lock()
		defer mu.Unlock()
		tick++
		return base.Add(time.Duration(tick) * time.Second)
	}
	c := cfg
	c.Timeout = 500 * time.Millisecond
	fx := newFixture(t, c, clock)
	fx.agg.Add("a", 1)
	fx.agg.Add("b", 2)
	err := fx.fl.Flush(context.Background())
	var inc *flusher.IncompleteError
	if !errors.As(err, &inc) || !errors.Is(err, flusher.ErrFlushDeadline) || inc.UnwrittenCounters != 2 || inc.Kept != 3 {
		t.Fatalf("Flush = %v, want the deadline with 3 mentions over 2 topics kept", err)
	}
	if len(fx.st.tried) != 0 {
		t.Errorf("writes started after the deadline: %v", fx.st.tried)
	}
	if a, b := fx.agg.Pending("a"), fx.agg.Pending("b"); a != 1 || b != 2 {
		t.Errorf("buffer a=%d b=%d, want 1 and 2", a, b)
	}
}

// TestEveryShardGetsWrites: flushes of one topic spread over all shards.
func TestEveryShardGetsWrites(t *testing.T) {
	fx := newFixture(t, cfg, nil)
	for range 200 {
		fx.agg.Add("spread", 1)
		if err := fx.fl.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	shards, err := fx.st.Gather(context.Background(), "spread", 4, false)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, s := range shards {
		if s.Count == 0 {
			t.Errorf("shard %d never written in 200 flushes: %v", s.Shard, shards)
		}
		sum += s.Count
	}
	if sum != 200 {
		t.Errorf("sum %d, want 200", sum)
	}
}

// TestFullWindowFlushesEarly: reaching --max-topics flushes before the
// interval (here an hour).
func TestFullWindowFlushesEarly(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	agg := aggregator.New(5, reg)
	fl := flusher.New(cfg, agg, b, zaptest.NewLogger(t), flusher.NewMetrics(reg), time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fl.Run(ctx) }()
	for i := range 5 {
		agg.Add(fmt.Sprintf("t%d", i), 1)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := testenv.Metric(t, reg, "hotcount_flusher_flushed_mentions_total"); n != 5 {
			return fmt.Errorf("%v of 5 flushed", n)
		}
		return nil
	})
	if n := testenv.Metric(t, reg, "hotcount_flusher_early_total"); n != 1 {
		t.Errorf("early flushes = %v, want 1", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFinalGivesUpAtDeadline: with the store down, Final retries while its
// context leaves time, then reports and counts what it could not write.
func TestFinalGivesUpAtDeadline(t *testing.T) {
	fx := newFixture(t, cfg, nil)
	fx.st.set(true)
	fx.agg.Add("x", 7)
	fx.agg.Add("y", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := fx.fl.Final(ctx)
	var sd *flusher.ShutdownError
	if !errors.As(err, &sd) || sd.Mentions != 10 || sd.Counters != 2 {
		t.Fatalf("Final = %v, want it to name 10 mentions over 2 counters", err)
	}
	if n := testenv.Metric(t, fx.reg, "hotcount_flusher_unflushed_total"); n != 10 {
		t.Errorf("unflushed = %v, want 10", n)
	}
	if len(fx.st.tried[schema.TotalOf("x")]) < 2 {
		t.Errorf("Final tried %d times, want retries while there is time for them", len(fx.st.tried[schema.TotalOf("x")]))
	}
}

// TestFinalStartsNoRetryItCannotFinish: with a slow store refusing every
// write, Final retries only while a retry has time to finish: no write is
// left in flight at the deadline (against a real store that would be a
// write in doubt), and what is left is reported before the deadline.
func TestFinalStartsNoRetryItCannotFinish(t *testing.T) {
	fx := newFixture(t, cfg, nil)
	const latency = 100 * time.Millisecond
	fx.st.latency = latency
	fx.st.set(true)
	fx.agg.Add("x", 7)
	// Attempts of 100 ms with 50, 100, 200 and 400 ms of backoff between
	// them start at 0, 150, 350, 650 and 1150 ms: without the check the
	// fifth would be cut off at 1200.
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	err := fx.fl.Final(ctx)
	var sd *flusher.ShutdownError
	if !errors.As(err, &sd) || sd.Mentions != 7 || sd.Counters != 1 {
		t.Fatalf("Final = %v, want it to name 7 mentions over 1 counter", err)
	}
	fx.st.mu.Lock()
	started := fx.st.started
	fx.st.mu.Unlock()
	if len(started) < 2 {
		t.Fatalf("%d attempts, want retries while there was time", len(started))
	}
	if last := started[len(started)-1]; last.Add(latency).After(deadline) {
		t.Errorf("the last of %d attempts started %s before the deadline, within its %s", len(started), deadline.Sub(last), latency)
	}
}

// TestDeadlinePassesMidFlush: the deadline passes while writes are in
// flight and failing; the unstarted ones are kept while the failed ones come
// back (under -race: no unguarded access to what is kept), and once the
// store answers, flushes write everything, once.
func TestDeadlinePassesMidFlush(t *testing.T) {
	c := cfg
	c.Timeout = 30 * time.Millisecond
	fx := newFixture(t, c, nil)
	fx.st.latency = 5 * time.Millisecond
	fx.st.set(true)
	for i := range 200 {
		fx.agg.Add(fmt.Sprintf("t%d", i), 1)
	}
	err := fx.fl.Flush(context.Background())
	var inc *flusher.IncompleteError
	if !errors.As(err, &inc) || inc.UnwrittenCounters != 200 || inc.Counters != 200 || inc.Kept != 200 {
		t.Fatalf("Flush = %v, want all 200 topics kept for the next flush", err)
	}
	if tried := len(fx.st.tried); tried == 0 || tried == 200 {
		t.Fatalf("%d writes started, want the deadline to pass mid-flush", tried)
	}
	fx.st.set(false)
	// Each later flush makes progress within its deadline until all is
	// written.
	for i := 0; ; i++ {
		if err := fx.fl.Flush(context.Background()); err == nil {
			break
		} else if i == 50 {
			t.Fatalf("still not written after 50 flushes: %v", err)
		}
	}
	var sum int64
	for i := range 200 {
		sum += fx.total(t, fmt.Sprintf("t%d", i), 4)
	}
	if sum != 200 {
		t.Errorf("store holds %d, want 200", sum)
	}
}

type recorder struct{ seen map[schema.Counter]int64 }

func (r *recorder) Observe(w map[schema.Counter]int64) {
	for c, d := range w {
		r.seen[c] += d
	}
}

// TestObserverSeesWhatWasWritten: the observer (the hot-topic tracker) is
// told of written deltas only, once each, never of failed ones.
func TestObserverSeesWhatWasWritten(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st := &faulty{Bolt: b, tried: map[schema.Counter][]int{}}
	agg := aggregator.New(100, reg)
	rec := &recorder{seen: map[schema.Counter]int64{}}
	fl := flusher.New(cfg, agg, st, zaptest.NewLogger(t), flusher.NewMetrics(reg), time.Now, flusher.WithObserver(rec))
	agg.Add("a", 3)
	st.set(true)
	if err := fl.Flush(context.Background()); err == nil {
		t.Fatal("Flush with the store down succeeded")
	}
	if len(rec.seen) != 0 {
		t.Errorf("observed %v from a failed flush", rec.seen)
	}
	st.set(false)
	agg.Add("b", 2)
	if err := fl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec.seen[schema.TotalOf("a")] != 3 || rec.seen[schema.TotalOf("b")] != 2 || len(rec.seen) != 2 {
		t.Errorf("observed %v, want a:3 b:2", rec.seen)
	}
}

// TestPoisonTopicDoesNotStopTheFlusher: one topic every write of which the
// store refuses keeps its mentions buffered, while the others are written;
// the flusher counts that as progress (liveness follows it), not as a
// failing store.
func TestPoisonTopicDoesNotStopTheFlusher(t *testing.T) {
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	fx := newFixture(t, cfg, clk.Now)
	fx.st.poison = schema.TotalOf("poison")
	for round := range 3 {
		clk.Add(time.Minute)
		fx.agg.Add("poison", 1)
		fx.agg.Add("golang", 2)
		if err := fx.fl.Flush(context.Background()); !errors.Is(err, errDown) {
			t.Fatalf("round %d: Flush = %v, want the poison topic's error", round, err)
		}
		if !fx.fl.LastProgress().Equal(clk.Now()) {
			t.Errorf("round %d: last progress %v, want now %v", round, fx.fl.LastProgress(), clk.Now())
		}
	}
	if got := fx.total(t, "golang", 4); got != 6 {
		t.Errorf("golang = %d, want 6", got)
	}
	if _, n := fx.agg.Stats(); n != 3 {
		t.Errorf("buffer holds %d mentions, want the poison topic's 3", n)
	}
}

// slowShards answers shard counts only when its context ends, with the
// fallback of one shard for every topic (a metadata store that hangs).
type slowShards struct{}

func (slowShards) WriteCounts(ctx context.Context, topics []string) (map[string]int, error) {
	<-ctx.Done()
	out := make(map[string]int, len(topics))
	for _, t := range topics {
		out[t] = 1
	}
	return out, ctx.Err()
}
func (slowShards) Throttled(context.Context, string) int { return 1 }

// TestHungMetadataDoesNotHoldCountsBack: the shard-count lookup hangs; it
// gets a quarter of the flush's budget, its fallback (one shard) comes in
// time, and every count is written in the same flush.
func TestHungMetadataDoesNotHoldCountsBack(t *testing.T) {
	c := cfg
	c.Timeout = 2 * time.Second // a quarter (500 ms) for the hung lookup, the rest for 20 writes on a loaded machine
	reg := prometheus.NewRegistry()
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	agg := aggregator.New(1000, reg)
	fl := flusher.New(c, agg, b, zaptest.NewLogger(t), flusher.NewMetrics(reg), time.Now, flusher.WithShards(slowShards{}))
	for i := range 20 {
		agg.Add(fmt.Sprintf("t%d", i), 1)
	}
	if err := fl.Flush(context.Background()); err != nil {
		t.Fatalf("Flush = %v, want every count written on its fallback shard", err)
	}
	got, _ := b.Gather(context.Background(), "t7", 1, true)
	if got[0].Count != 1 {
		t.Errorf("t7 = %v, want 1 on shard 0", got)
	}
}

// TestFinalWritesWhatWaitedBehindDoubt: a topic's write is applied and its
// answer lost; more mentions of the topic arrive and wait behind it. The
// final flush settles the write and then writes what waited, each once.
func TestFinalWritesWhatWaitedBehindDoubt(t *testing.T) {
	fx := newFixture(t, cfg, nil)
	fx.st.loseFirst = true
	ctx := context.Background()
	fx.agg.Add("golang", 5)
	if err := fx.fl.Flush(ctx); !errors.Is(err, store.ErrAmbiguous) {
		t.Fatalf("Flush = %v, want the lost answer", err)
	}
	fx.agg.Add("golang", 7) // waits behind the write in doubt
	final, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := fx.fl.Final(final); err != nil {
		t.Fatalf("Final: %v", err)
	}
	if got := fx.total(t, "golang", 4); got != 12 {
		t.Errorf("golang = %d, want 12: the 5 once and the 7 that waited", got)
	}
	if _, n := fx.agg.Stats(); n != 0 {
		t.Errorf("%d mentions left in the buffer after Final", n)
	}
}

// TestEndByLeavesNoWriteInFlight: a flush in progress at shutdown (no
// deadline of its own) given EndBy stops starting writes that could not
// finish by then: none is in flight at that time (against a real store,
// each would be a write in doubt), what it did not start is kept, and the
// next flush writes it, so every mention is in the store once.
func TestEndByLeavesNoWriteInFlight(t *testing.T) {
	fx := newFixture(t, cfg, nil)
	const latency = 100 * time.Millisecond
	fx.st.latency = latency
	for i := range 40 { // 10 rounds of 4: a second of writes
		fx.agg.Add(fmt.Sprintf("t%d", i), 1)
	}
	end := time.Now().Add(450 * time.Millisecond)
	fx.fl.EndBy(end)
	err := fx.fl.Flush(context.Background())
	var inc *flusher.IncompleteError
	if !errors.As(err, &inc) || inc.UnwrittenCounters == 0 {
		t.Fatalf("Flush = %v, want some counters left for the next flush", err)
	}
	fx.st.mu.Lock()
	started := fx.st.started
	fx.st.mu.Unlock()
	for _, s := range started {
		if s.Add(latency).After(end) {
			t.Errorf("a write started %s before EndBy, within its %s", end.Sub(s), latency)
		}
	}
	fx.fl.EndBy(time.Time{}) // none: the next flush writes the rest
	if err := fx.fl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if got := fx.total(t, fmt.Sprintf("t%d", i), cfg.Shards); got != 1 {
			t.Errorf("t%d: %d in the store, want 1", i, got)
		}
	}
}
