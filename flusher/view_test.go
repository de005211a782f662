package flusher_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/flusher"
	"github.com/hotcount/hotcount/internal/testenv"
)

type told struct {
	mu     sync.Mutex
	deltas map[string]int64
}

func (r *told) Wrote(topic string, delta int64, sent, landed time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if landed.Before(sent) {
		panic("landed before sent")
	}
	r.deltas[topic] += delta
}

// TestReadSeesEveryMentionOnce: while a flush writes, a topic's mentions
// are in exactly one place for a reader: the buffer, the window being
// written (until its write is sent), the write on its way (for a total
// gathered before it was sent), or the reader's cache (told when it
// lands). A total gathered after the send sees neither, and Sending says
// the write is on its way.
func TestReadSeesEveryMentionOnce(t *testing.T) {
	c := cfg
	c.Shards = 1
	fx := newFixture(t, c, nil)
	r := &told{deltas: map[string]int64{}}
	fx.fl = flusher.New(c, fx.agg, fx.st, zaptest.NewLogger(t), flusher.NewMetrics(prometheus.NewRegistry()), time.Now, flusher.WithReader(r))
	fx.st.latency = 300 * time.Millisecond
	pending := func(gatheredAt time.Time) (n int64) {
		fx.fl.Read("golang", func(p func(time.Time) int64) { n = p(gatheredAt) })
		return n
	}
	before := time.Now()
	fx.agg.Add("golang", 5)
	if n := pending(before); n != 5 {
		t.Fatalf("buffered: pending %d, want 5", n)
	}
	done := make(chan error, 1)
	go func() { done <- fx.fl.Flush(context.Background()) }()
	testenv.Eventually(t, 5*time.Second, func() error {
		if !fx.fl.Sending("golang") {
			return errors.New("the write is not on its way yet")
		}
		return nil
	})
	fx.agg.Add("golang", 2) // arrives during the flush
	if n := pending(before); n != 7 {
		t.Errorf("write on its way, total gathered before it: pending %d, want 7", n)
	}
	if n := pending(time.Now()); n != 2 {
		t.Errorf("write on its way, total gathered after it was sent: pending %d, want 2 (the write may be in it)", n)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := pending(before); n != 2 {
		t.Errorf("after the write landed: pending %d, want 2", n)
	}
	if fx.fl.Sending("golang") {
		t.Error("Sending after the write landed")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.deltas["golang"] != 5 {
		t.Errorf("reader told of %d, want 5", r.deltas["golang"])
	}
}
