package flusher

import (
	"iter"

	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// ledger is what this writer still owes: its writes in doubt, each sent
// again unchanged (as a retry) until the store settles it, and its topic's
// newer deltas held back behind it.
//
// It is not safe for concurrent use. The Flusher owns it, and only the
// goroutine holding Flusher.flushMu uses it.
type ledger struct {
	metrics *Metrics
	pending map[schema.Counter]store.Write // writes in doubt
}

func newLedger(m *Metrics) *ledger {
	return &ledger{metrics: m, pending: make(map[schema.Counter]store.Write)}
}

// waiting returns the topics with a write in doubt, of their total or of
// a time bucket.
func (l *ledger) waiting() map[string]bool {
	w := make(map[string]bool, len(l.pending))
	for c := range l.pending {
		w[c.Topic] = true
	}
	return w
}

// resendable yields, by counter, the writes in doubt to send again, while
// more says so.
func (l *ledger) resendable(more func() bool) iter.Seq2[schema.Counter, store.Write] {
	return func(yield func(schema.Counter, store.Write) bool) {
		for c, w := range l.pending {
			if !more() || !yield(c, w) {
				return
			}
		}
	}
}

// writes is how many writes are in doubt.
func (l *ledger) writes() int { return len(l.pending) }

// settle drops the writes now in the store (by counter).
func (l *ledger) settle(settled map[schema.Counter]int64) {
	for c := range settled {
		delete(l.pending, c)
	}
}

// doubted makes each new write in doubt c's pending write, sent again
// as a retry, unless c has one.
func (l *ledger) doubted(doubt map[schema.Counter]store.Write) {
	for c, w := range doubt {
		if _, ok := l.pending[c]; !ok {
			w.Retry = true
			l.pending[c] = w
		}
	}
}

// keepPending publishes how many writes are in doubt.
func (l *ledger) keepPending() { l.metrics.pending.Set(float64(len(l.pending))) }

// atExit says how many mentions are left in writes in doubt, for the
// shutdown's report.
func (l *ledger) atExit() (doubt int64) {
	for c, w := range l.pending {
		if !c.IsBucket() { // a time bucket's mentions are counted with their topic's
			doubt += w.Delta
		}
	}
	return doubt
}
