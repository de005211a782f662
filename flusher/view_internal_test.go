package flusher

import (
	"testing"
	"time"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/store"
)

// buffered is a Buffer holding fixed pending counts.
type buffered map[string]int64

func (b buffered) Drain() aggregator.Window   { return aggregator.Window{} }
func (b buffered) Merge(aggregator.Window)    {}
func (b buffered) Full() <-chan struct{}      { return nil }
func (b buffered) Pending(topic string) int64 { return b[topic] }

type wrote map[string]int64

func (w wrote) Wrote(topic string, delta int64, _, _ time.Time) { w[topic] += delta }

func pendingAt(v *view, topic string, gatheredAt time.Time) (n int64) {
	v.Read(topic, func(p func(time.Time) int64) { n = p(gatheredAt) })
	return n
}

// TestViewFollowsAWrite: a mention is counted once by a reader whatever
// its write's state: held by the flush, on its way (for a total gathered
// before it was sent), in doubt between two sends, or landed (the
// reader's).
func TestViewFollowsAWrite(t *testing.T) {
	r := wrote{}
	v := newView(buffered{"golang": 2}, r, time.Now)
	before, sent := noon, noon.Add(time.Second)
	after := sent.Add(time.Second)
	v.move(func() *aggregator.Deltas { return aggregator.DeltasOf(map[string]int64{"golang": 5}) })
	if n := pendingAt(v, "golang", before); n != 7 {
		t.Errorf("held by the flush: %d, want 7", n)
	}
	v.sending(store.TotalOf("golang"), sent)
	if !v.Sending("golang") || pendingAt(v, "golang", before) != 7 || pendingAt(v, "golang", after) != 2 {
		t.Errorf("on its way: sending %v, %d before, %d after; want true, 7, 2", v.Sending("golang"), pendingAt(v, "golang", before), pendingAt(v, "golang", after))
	}
	v.answered(answer{write: store.Write{Counter: store.TotalOf("golang"), Delta: 5}, sentAt: sent, outcome: inDoubt})
	if v.Sending("golang") || pendingAt(v, "golang", before) != 7 || pendingAt(v, "golang", after) != 2 {
		t.Errorf("in doubt: sending %v, %d before, %d after; want false, 7, 2", v.Sending("golang"), pendingAt(v, "golang", before), pendingAt(v, "golang", after))
	}
	v.resending(store.TotalOf("golang"))
	if !v.Sending("golang") {
		t.Error("sent again: not on its way")
	}
	v.resent(store.TotalOf("golang"), applied)
	if v.Sending("golang") || pendingAt(v, "golang", before) != 2 || r["golang"] != 5 {
		t.Errorf("landed: sending %v, %d pending, reader told %d; want false, 2, 5", v.Sending("golang"), pendingAt(v, "golang", before), r["golang"])
	}
}

// TestViewRefusedWriteIsHeldAgain: a refused write's delta is the flush's
// again, for any gather; a landed bucket's is no total for the reader.
func TestViewRefusedWriteIsHeldAgain(t *testing.T) {
	r := wrote{}
	v := newView(buffered{}, r, time.Now)
	v.move(func() *aggregator.Deltas {
		return aggregator.DeltasOf(map[string]int64{"x": 3, minuteOf("x").Name(): 3})
	})
	v.sending(store.TotalOf("x"), noon)
	v.answered(answer{write: store.Write{Counter: store.TotalOf("x"), Delta: 3}, sentAt: noon, outcome: refused})
	if v.Sending("x") || pendingAt(v, "x", noon.Add(time.Hour)) != 3 {
		t.Errorf("refused: sending %v, pending %d; want false, 3", v.Sending("x"), pendingAt(v, "x", noon.Add(time.Hour)))
	}
	v.sending(minuteOf("x"), noon)
	v.answered(answer{write: store.Write{Counter: minuteOf("x"), Delta: 3}, sentAt: noon, outcome: applied})
	if len(r) != 0 {
		t.Errorf("reader told of %v, want nothing (a bucket)", r)
	}
}
