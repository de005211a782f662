package flusher_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/store"
)

// cancelling is a store that refuses every write and ends the shutdown's
// context (a second SIGTERM, the budget spent) during its third.
type cancelling struct {
	attempts atomic.Int32
	cancel   context.CancelFunc
}

func (c *cancelling) Add(context.Context, store.Write, time.Time) error {
	if c.attempts.Add(1) == 3 {
		c.cancel()
	}
	return errDown
}

// TestFinalEndsWithItsContext: Final without a deadline retries a failing
// store until its context ends, then gives up at once: no retry after
// it, and what is left is reported and counted.
func TestFinalEndsWithItsContext(t *testing.T) {
	reg := prometheus.NewRegistry()
	agg := aggregator.New(10, reg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &cancelling{cancel: cancel}
	fl := flusher.New(cfg, agg, st, zaptest.NewLogger(t), flusher.NewMetrics(reg), time.Now)
	agg.Add("x", 7)
	if err := fl.Final(ctx); err == nil {
		t.Fatal("Final succeeded against a store refusing everything")
	}
	if n := st.attempts.Load(); n != 3 {
		t.Errorf("%d attempts, want 3: none once the context ended", n)
	}
	if n := testenv.Metric(t, reg, "hotcount_flusher_unflushed_total"); n != 7 {
		t.Errorf("unflushed = %v, want 7", n)
	}
}
