package flusher

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

func testLedger() *ledger { return newLedger(NewMetrics(prometheus.NewRegistry())) }

// TestDoubtWaitsUntilSettled: a write in doubt becomes its counter's
// pending write, sent again as a retry and unchanged (a later doubt of the
// counter does not replace it); its topic waits while any of its counters
// has one, and is clear once the store settles them all.
func TestDoubtWaitsUntilSettled(t *testing.T) {
	l := testLedger()
	total, hour := store.Write{Counter: schema.TotalOf("foo"), Delta: 5, Seq: 7}, store.Write{Counter: hourOf("foo"), Delta: 5, Seq: 8}
	l.doubted(map[schema.Counter]store.Write{total.Counter: total, hour.Counter: hour})
	l.doubted(map[schema.Counter]store.Write{total.Counter: {Counter: total.Counter, Delta: 9, Seq: 12}})
	if w := l.pending[total.Counter]; !w.Retry || w.Seq != 7 || w.Delta != 5 {
		t.Errorf("foo's total pending as %+v, want the first write in doubt, as a retry", w)
	}
	if w := l.waiting(); !w["foo"] || len(w) != 1 {
		t.Errorf("waiting %v, want foo", w)
	}
	sent := map[schema.Counter]bool{}
	for c, w := range l.resendable(func() bool { return true }) {
		if !w.Retry {
			t.Errorf("%+v resent as a new write", w)
		}
		sent[c] = true
	}
	if len(sent) != 2 {
		t.Errorf("resendable %v, want foo's total and hour", sent)
	}
	for c := range l.resendable(func() bool { return false }) {
		t.Errorf("%+v yielded past the deadline", c)
	}
	l.settle(map[schema.Counter]int64{total.Counter: 5})
	if w := l.waiting(); !w["foo"] || l.writes() != 1 {
		t.Errorf("foo's hour still in doubt: waiting %v, %d pending; want foo, 1", w, l.writes())
	}
	l.settle(map[schema.Counter]int64{hour.Counter: 5})
	if w := l.waiting(); len(w) != 0 || l.writes() != 0 {
		t.Errorf("all settled: waiting %v, %d pending; want none", w, l.writes())
	}
}

// TestAtExit: at shutdown, the mentions of the writes in doubt are
// reported once (a bucket's mentions are its total's).
func TestAtExit(t *testing.T) {
	l := testLedger()
	l.doubted(map[schema.Counter]store.Write{
		schema.TotalOf("foo"): {Counter: schema.TotalOf("foo"), Delta: 5},
		hourOf("foo"):         {Counter: hourOf("foo"), Delta: 5},
		schema.TotalOf("bar"): {Counter: schema.TotalOf("bar"), Delta: 3},
	})
	if doubt := l.atExit(); doubt != 8 {
		t.Errorf("doubt %d, want 8", doubt)
	}
}
