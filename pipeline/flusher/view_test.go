package flusher_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// gated is a store whose writes, once they reach it, wait until the test
// releases them: a write stays on its way for as long as the test looks
// at it, however slow the machine.
type gated struct {
	flusher.Store
	arrived chan store.Write // each write as it reaches the store, before it waits
	release chan struct{}    // closed: the writes go on into the store
}

func newGated(st flusher.Store) *gated {
	return &gated{Store: st, arrived: make(chan store.Write, 1), release: make(chan struct{})}
}

func (g *gated) Add(ctx context.Context, w store.Write, now time.Time) error {
	select {
	case g.arrived <- w:
	case <-g.release: // released: nobody waits for arrivals any more
	}
	<-g.release
	return g.Store.Add(ctx, w, now)
}

// TestReadSeesEveryMentionOnce: while a flush writes, a topic's mentions
// are in exactly one place for a reader of its view: the buffer, the
// window being written (until its write is sent), the write on its way
// (for a total gathered before it was sent), or landed (added to a total
// gathered before it was sent). A total gathered after the send sees
// neither, and OnItsWay says the write is on its way.
func TestReadSeesEveryMentionOnce(t *testing.T) {
	c := cfg
	c.Shards = 1
	c.WriteTimeout = time.Hour // the write waits for the test, not for a timeout
	fx := newFixture(t, c, nil)
	v := ownwrites.New(ownwrites.Config{Keep: time.Hour, Topics: 10}, time.Now)
	st := newGated(fx.st)
	fx.fl = flusher.New(c, fx.agg, st, zaptest.NewLogger(t), flusher.NewMetrics(prometheus.NewRegistry()), time.Now, flusher.WithView(v))
	pending := func(gatheredAt time.Time) int64 {
		_, n, _ := v.Read("golang", ownwrites.Gather{At: gatheredAt})
		return n
	}
	before := time.Now()
	mark := v.Mark("golang") // a total gathered now, before the write
	fx.agg.Add("golang", 5)
	if n := pending(before); n != 5 {
		t.Fatalf("buffered: pending %d, want 5", n)
	}
	var flushErr error
	flushed := make(chan struct{})
	go func() { flushErr = fx.fl.Flush(context.Background()); close(flushed) }()
	// finish releases the write and waits for the flush, once: at the
	// end of the test, or at its cleanup if a check stops it before, so
	// that no flush outlives the store.
	finish := sync.OnceValue(func() error { close(st.release); <-flushed; return flushErr })
	t.Cleanup(func() { finish() })
	select {
	case w := <-st.arrived:
		if w.Counter != schema.TotalOf("golang") {
			t.Fatalf("the store got a write of %v, want golang's total", w.Counter)
		}
	case <-flushed:
		t.Fatalf("the flush ended before its write reached the store: %v", flushErr)
	}
	if !v.OnItsWay("golang") {
		t.Error("the write is at the store, and OnItsWay says it is not")
	}
	fx.agg.Add("golang", 2) // arrives during the flush
	if n := pending(before); n != 7 {
		t.Errorf("write on its way, total gathered before it: pending %d, want 7", n)
	}
	if n := pending(time.Now()); n != 2 {
		t.Errorf("write on its way, total gathered after it was sent: pending %d, want 2 (the write may be in it)", n)
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if n := pending(before); n != 2 {
		t.Errorf("after the write landed: pending %d, want 2", n)
	}
	if v.OnItsWay("golang") {
		t.Error("OnItsWay after the write landed")
	}
	if add, _, ok := v.Landed(ownwrites.Gather{Mark: mark, Started: before, At: before}); !ok || add != 5 {
		t.Errorf("a total gathered before the write: landed %d (ok %v), want 5", add, ok)
	}
}
