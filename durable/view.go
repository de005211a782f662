package durable

import (
	"sync"
	"time"

	"github.com/hotcount/hotcount/store"
)

// view is where a mention this sidecar read is, as readers of totals see
// it: in the window, in the window a flush holds, in a write on its way
// or in doubt, or (once a write lands) in the Reader's totals. The flush
// moves totals in it only under its lock, each move one step for a
// reader, and the Reader is told of a landed write under it, as the write
// leaves the view; readers take its read lock. (The flusher's view, in
// core mode, is the same idea over its own buffer.)
type view struct {
	reader Reader // nil: none
	mu     sync.RWMutex
	// inflight are the topic totals the flush holds and has not written
	// or given back; sent, those whose write has started; doubt, writes
	// in doubt, sent again next flush.
	inflight map[string]int64
	sent     map[string]sending
	doubt    map[string]sending
}

// sending is a total's write as readers see it: when it was first sent,
// its delta, and whether it is on its way (sent and not answered: a total
// read now may or may not include it).
type sending struct {
	at       time.Time
	delta    int64
	onItsWay bool
	back     bool // refused: its entry is the window's again at the flush's end (settle)
}

// take runs the drain under the view's lock and makes the totals it
// drained the flush's.
func (v *view) take(drain func() map[key]*entry) map[key]*entry {
	v.mu.Lock()
	defer v.mu.Unlock()
	d := drain()
	v.inflight, v.sent = make(map[string]int64), make(map[string]sending)
	for k, ent := range d {
		if k.c.Kind == store.Total || k.c.Kind == store.Fresh {
			v.inflight[k.c.Topic], _ = store.SatAdd(v.inflight[k.c.Topic], ent.delta)
		}
	}
	if v.doubt == nil {
		v.doubt = make(map[string]sending)
	}
	return d
}

// sending marks a total's write as on its way since at.
func (v *view) sending(j job, at time.Time) {
	if j.k.c.Kind != store.Total || j.replay != nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if j.retry {
		if d, ok := v.doubt[j.k.c.Topic]; ok {
			d.onItsWay = true
			v.doubt[j.k.c.Topic] = d
		}
		return
	}
	v.sent[j.k.c.Topic] = sending{at: at, onItsWay: true}
}

// answered takes a total's answer: applied, the reader holds it from now
// (told here, as it leaves the view); in doubt, it is held as a write in
// doubt until sent again; else it is neither in the store by this write
// nor on its way (given back at the flush's end, or written by another).
func (v *view) answered(j job, out outcome, sent, now time.Time) {
	if j.k.c.Kind != store.Total || j.replay != nil {
		return
	}
	topic := j.k.c.Topic
	v.mu.Lock()
	defer v.mu.Unlock()
	if j.retry {
		d, ok := v.doubt[topic]
		switch {
		case !ok:
		case out == applied || out == covered:
			delete(v.doubt, topic)
			if out == applied && v.reader != nil {
				v.reader.Wrote(topic, j.e.delta, d.at, now)
			}
		default:
			d.onItsWay, d.back = false, out == failed
			v.doubt[topic] = d
		}
		return
	}
	// A write in doubt that overlapped another reader's is sent on as a
	// new write of its rest (send): its answer settles the doubt too.
	d, doubted := v.doubt[topic]
	switch out {
	case applied:
		v.sent[topic] = sending{at: sent}
		delete(v.doubt, topic)
		if v.reader != nil {
			v.reader.Wrote(topic, j.e.delta, sent, now)
		}
	case covered:
		delete(v.sent, topic)
		delete(v.doubt, topic)
	case inDoubt:
		v.sent[topic] = sending{at: sent}
		v.doubt[topic] = sending{at: sent, delta: j.e.delta}
	default:
		delete(v.sent, topic)
		if doubted {
			d.onItsWay, d.back = false, true
			v.doubt[topic] = d
		}
	}
}

// settle runs giveBack, which returns what the flush did not write to the
// window, and ends the flush's hold, in one step for readers.
func (v *view) settle(giveBack func()) {
	v.mu.Lock()
	defer v.mu.Unlock()
	giveBack()
	v.inflight, v.sent = nil, nil
	for topic, d := range v.doubt {
		if d.back {
			delete(v.doubt, topic)
		}
	}
}

// read calls read with topic's pending count: window holds what the
// window has of it.
func (v *view) read(topic string, window func() int64, read func(pending func(gatheredAt time.Time) int64)) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	read(func(gatheredAt time.Time) int64 {
		q := v.inflight[topic]
		// A write answered is the reader's (applied) or in doubt (below);
		// one on its way is left out of a total gathered after it was
		// sent, which may hold it already.
		if s, ok := v.sent[topic]; ok && (!s.onItsWay || !gatheredAt.Before(s.at)) {
			q = 0
		}
		if d, ok := v.doubt[topic]; ok && gatheredAt.Before(d.at) {
			q += d.delta // first sent after the gather: it cannot be in it
		}
		sum, _ := store.SatAdd(window(), q)
		return sum
	})
}

// onItsWay says whether a write of topic is on its way to the store.
func (v *view) onItsWay(topic string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	s, ok := v.sent[topic]
	d, doubted := v.doubt[topic]
	return ok && s.onItsWay || doubted && d.onItsWay
}
