package durable_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
)

// denier refuses for good (store.ErrDenied, as an IAM condition on some
// keys does) every write of one topic while on.
type denier struct {
	durable.Store
	topic    string
	on       atomic.Bool
	refusals atomic.Int64
}

func (d *denier) Add(ctx context.Context, w store.Write, now time.Time) error {
	if d.on.Load() && w.Counter.Topic == d.topic {
		d.refusals.Add(1)
		return fmt.Errorf("AccessDeniedException on %s: %w", d.topic, store.ErrDenied)
	}
	return d.Store.Add(ctx, w, now)
}

// A counter the store refuses for good is held in its stream's checkpoint
// record: the other topics are written, the checkpoint passes it (it
// holds back neither the stream's retention nor a restart), and a sidecar
// that starts from that checkpoint, whose store takes the counter, writes
// what is held and what it reads after it: exact, nothing lost between
// the held span and its own (it sends its mentions of the held counter to
// the record, not to the item, which would then claim the held ones).
func TestRefusedCounterIsHeldThenWritten(t *testing.T) {
	e := setup(t)
	want := map[string]int64{}
	d := &denier{Store: e.store(e.db.Endpoint), topic: "topic-0"}
	d.on.Store(true)
	ctx, stop := context.WithCancel(context.Background())
	quarantine := func(c *durable.Config) { c.QuarantineAfter = 300 * time.Millisecond }
	a := e.run(t, ctx, d, quarantine)
	e.publish(t, 1_000, 10, want) // sequences 1..1000, 100 of topic-0
	others := make(map[string]int64)
	for topic, n := range want {
		if topic != d.topic {
			others[topic] = n
		}
	}
	e.exact(t, others)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := testenv.Metric(t, a.reg, "hotcount_durable_checkpoint_sequence"); n != 1_000 {
			return fmt.Errorf("checkpoint at %v, want 1000: past the held counter", n)
		}
		return nil
	})
	if n := testenv.Metric(t, a.reg, "hotcount_flusher_quarantined_mentions_total"); n != 100 {
		t.Errorf("hotcount_flusher_quarantined_mentions_total %v, want topic-0's 100", n)
	}
	if n := testenv.Metric(t, a.reg, "hotcount_durable_held_counters"); n != 1 {
		t.Errorf("hotcount_durable_held_counters %v, want 1 (topic-0's total)", n)
	}
	if n := testenv.Metric(t, a.reg, "hotcount_durable_held_counters_fullest_stream"); n != 1 {
		t.Errorf("hotcount_durable_held_counters_fullest_stream %v, want 1 (the one stream's)", n)
	}
	stop()

	bctx, stopB := context.WithCancel(context.Background())
	b := e.run(t, bctx, e.store(e.db.Endpoint), quarantine)
	t.Cleanup(stopB)
	e.publish(t, 500, 10, want) // sequences 1001..1500, 50 more of topic-0
	e.exact(t, want)
	if n := testenv.Metric(t, b.reg, "hotcount_flusher_quarantined_writes_total"); n != 0 {
		t.Errorf("the second sidecar held %v counters, with a store that takes them", n)
	}
	testenv.Eventually(t, 30*time.Second, func() error { // the hold it adopted, written, is let go
		if n := testenv.Metric(t, b.reg, "hotcount_durable_held_counters"); n != 0 {
			return fmt.Errorf("%v counters still held", n)
		}
		return nil
	})
}

// TestRefusedTopicKeepsTheEngineLive: flushes whose only writes the store
// refuses for good (one poisoned topic in a quiet spell) are progress for
// liveness, as in core mode: failing /healthz would have the kubelet
// restart the sidecar, which mends nothing and starts --quarantine-after
// again, so the topic would never be held.
func TestRefusedTopicKeepsTheEngineLive(t *testing.T) {
	e := setup(t)
	d := &denier{Store: e.store(e.db.Endpoint), topic: "topic-0"}
	d.on.Store(true)
	ctx, stop := context.WithCancel(context.Background())
	a := e.run(t, ctx, d, func(c *durable.Config) { c.QuarantineAfter = time.Hour })
	t.Cleanup(stop)                          // after run's: cleanups run last first
	e.publish(t, 100, 1, map[string]int64{}) // topic-0 only
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := d.refusals.Load(); n < 1 {
			return fmt.Errorf("%d refusals", n)
		}
		return nil
	})
	before, wrote, seen := a.LastProgress(), a.LastWrite(), d.refusals.Load()
	testenv.Eventually(t, 30*time.Second, func() error { // three more flushes, each refused only
		if n := d.refusals.Load(); n < seen+3 {
			return fmt.Errorf("%d refusals since, want 3", n-seen)
		}
		return nil
	})
	if after := a.LastProgress(); !after.After(before) || a.Failing() {
		t.Errorf("last progress %s, then %s after three flushes refused for good (failing %v): want it to move on", before.Format(time.StampMilli), after.Format(time.StampMilli), a.Failing())
	}
	// ... while the last write stays where it was, for the alert that a
	// store refusing every write must raise (HotcountStoreRefusesWrites).
	if after := a.LastWrite(); !after.Equal(wrote) {
		t.Errorf("last write %s, then %s after three flushes that wrote nothing: want it to stay", wrote.Format(time.StampMilli), after.Format(time.StampMilli))
	}
}

// doubtThenDenied loses the answer to topic's first write (not applied),
// then refuses every write of it for good, the way store.DynamoDB's
// addFailed reports a retry refused for good: ErrAmbiguous wrapping
// ErrDenied (pipeline/store/dynamodb.go, addFailed).
type doubtThenDenied struct {
	durable.Store
	topic string
	sent  atomic.Int64
}

func (d *doubtThenDenied) Add(ctx context.Context, w store.Write, now time.Time) error {
	if w.Counter.Topic != d.topic {
		return d.Store.Add(ctx, w, now)
	}
	if d.sent.Add(1) == 1 {
		return fmt.Errorf("%w: connection reset", store.ErrAmbiguous)
	}
	denied := fmt.Errorf("AccessDeniedException: %w", store.ErrDenied)
	if w.Retry {
		return fmt.Errorf("%w: %w", store.ErrAmbiguous, denied)
	}
	return denied
}

// TestDoubtThenDeniedIsHeld: a write in doubt that the store then
// refuses for good is held by the quarantine like any write refused for
// good (found by an outside review: it stayed in doubt for ever, its
// counter's later mentions behind it and the checkpoint below it).
func TestDoubtThenDeniedIsHeld(t *testing.T) {
	e := setup(t)
	d := &doubtThenDenied{Store: e.store(e.db.Endpoint), topic: "topic-0"}
	ctx, stop := context.WithCancel(context.Background())
	a := e.run(t, ctx, d, func(c *durable.Config) { c.QuarantineAfter = 300 * time.Millisecond })
	t.Cleanup(stop) // after run's: cleanups run last first
	e.publish(t, 100, 10, map[string]int64{})
	testenv.Eventually(t, 30*time.Second, func() error {
		held := testenv.Metric(t, a.reg, "hotcount_durable_held_counters")
		ckpt := testenv.Metric(t, a.reg, "hotcount_durable_checkpoint_sequence")
		if held == 0 || ckpt != 100 {
			return fmt.Errorf("%d sends of topic-0: held %v, checkpoint %v of 100", d.sent.Load(), held, ckpt)
		}
		return nil
	})
}
