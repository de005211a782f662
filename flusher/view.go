package flusher

import (
	"sync"
	"time"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/store"
)

// view is where a mention accepted by this sidecar is, as readers see it:
// in the buffer, in the window a flush holds, in a write on its way or in
// doubt, or (once a write lands) in the Reader's totals. It is safe for
// concurrent use. The Flusher owns it; the flush moves counters in it only
// through its methods, each one step for a reader, and readers only take
// its read lock.
type view struct {
	buf    Buffer
	reader Reader // nil: none
	now    func() time.Time

	// mu guards inflight, sent and doubt. It is also held across each
	// move of counters between the buffer and inflight (move), so that a
	// reader never finds a mention in both or in neither; and the Reader
	// is told of a landed write under it, as the write leaves the view.
	mu       sync.RWMutex
	inflight *aggregator.Deltas        // the counters a flush holds and has not written, by name
	sent     map[store.Counter]sending // inflight counters whose write has started
	doubt    map[store.Counter]sending // writes in doubt
}

// sending is a write as readers see it: when it was first sent, its
// delta, and whether it is on its way to the store now. A write not on its
// way may have landed (the reader was told), or be in doubt between two
// sends: the flag says only that no answer is coming for it now.
type sending struct {
	at    time.Time
	delta int64
	// onItsWay: sent and not yet answered, so a total read now may or may
	// not include it.
	onItsWay bool
}

func newView(buf Buffer, reader Reader, now func() time.Time) *view {
	return &view{buf: buf, reader: reader, now: now, doubt: make(map[store.Counter]sending)}
}

// Sending reports whether a write of topic is on its way to the store: sent
// and not landed, so a total read now may or may not include it.
func (v *view) Sending(topic string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	total := store.TotalOf(topic)
	s, ok := v.sent[total]
	d, doubted := v.doubt[total]
	return ok && s.onItsWay || doubted && d.onItsWay
}

// Read: see Flusher.Read.
func (v *view) Read(topic string, read func(pending func(gatheredAt time.Time) int64)) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	total := store.TotalOf(topic)
	read(func(gatheredAt time.Time) int64 {
		p := v.buf.Pending(topic)
		q, _ := v.inflight.Get(total.Name()) // 0 when not there
		// A new write answered is the reader's (applied) or counted in
		// doubt (below); one still on its way is left out of a total
		// gathered after it was sent, which may include it already.
		if s, ok := v.sent[total]; ok && (!s.onItsWay || !gatheredAt.Before(s.at)) {
			q = 0
		}
		if d, ok := v.doubt[total]; ok && gatheredAt.Before(d.at) {
			q += d.delta // first sent after the gather: it cannot be in it
		}
		sum, _ := store.SatAdd(p, q)
		return sum
	})
}

// move runs fn, which moves counters between the buffer and what the
// flush holds, as one step for readers, and makes what fn returns the
// window the flush holds with none of its writes started.
func (v *view) move(fn func() *aggregator.Deltas) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.inflight, v.sent = fn(), nil
}

// sending marks c's new write as on its way since at.
func (v *view) sending(c store.Counter, at time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sent == nil {
		v.sent = make(map[store.Counter]sending)
	}
	v.sent[c] = sending{at: at, onItsWay: true}
}

// answered takes the answer to a new write: applied, the reader holds it; in
// doubt, it is held like a pending write until sent again; refused, its
// delta is the flush's again.
func (v *view) answered(a answer) {
	v.mu.Lock()
	defer v.mu.Unlock()
	c, delta := a.write.Counter, a.write.Delta
	switch a.outcome {
	case applied:
		v.sent[c] = sending{at: a.sentAt}
		v.wrote(c, delta, a.sentAt)
	case inDoubt:
		v.sent[c] = sending{at: a.sentAt}
		v.doubt[c] = sending{at: a.sentAt, delta: delta} // not on its way until sent again
	default:
		delete(v.sent, c)
	}
}

// resending marks c's pending write as on its way again.
func (v *view) resending(c store.Counter) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if d, ok := v.doubt[c]; ok {
		d.onItsWay = true
		v.doubt[c] = d
	}
}

// resent takes the answer to a pending write sent again: applied, it
// leaves the view for the reader's totals; otherwise it stays, not on its
// way.
func (v *view) resent(c store.Counter, o outcome) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, ok := v.doubt[c]
	switch {
	case !ok:
	case o == applied:
		delete(v.doubt, c)
		v.wrote(c, d.delta, d.at)
	default:
		d.onItsWay = false
		v.doubt[c] = d
	}
}

// wrote tells the reader of a landed write of a topic's total (a time
// bucket's is no total). Under mu.
func (v *view) wrote(c store.Counter, delta int64, sent time.Time) {
	if v.reader != nil && !c.IsBucket() {
		v.reader.Wrote(c.Topic, delta, sent, v.now())
	}
}
