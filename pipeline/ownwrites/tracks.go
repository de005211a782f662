package ownwrites

import (
	"sync/atomic"
	"time"
)

// maxLandings bounds the landings kept per topic: a cached total older
// than that many of its topic's landings is gathered again.
const maxLandings = 64

// landing is a write of a topic's total that landed: when it was first
// sent, when it was known to have landed, and its delta.
type landing struct {
	sent, landed time.Time
	delta        int64
}

// track is a topic's landings, kept while a total gathered of it may be
// cached. n, the count of landings ever recorded, is read without a lock,
// so that a reader whose total has seen them all takes none; the rest is
// guarded by View.mu.
type track struct {
	n        atomic.Uint64 // first + len(landings), stored after each landing
	used     atomic.Int64  // UnixNano of the last Mark
	first    uint64        // index of landings[0]
	landings []landing
	gone     atomic.Bool // dropped from the view: its marks see no landings any more
}

// tracks are the tracks of the topics readers gathered lately, at most
// limit of them.
type tracks struct {
	topics map[string]*track
	limit  int
}

// get returns topic's track, new if it has none. Under View.mu.
func (ts *tracks) get(topic string, now time.Time, keep time.Duration) *track {
	if t, ok := ts.topics[topic]; ok {
		return t
	}
	if len(ts.topics) >= ts.limit {
		ts.sweep(now, keep)
	}
	t := &track{}
	ts.topics[topic] = t
	return t
}

// sweep drops the tracks no total that may still be cached was gathered
// with (unmarked for twice keep), and more if that is not a quarter of
// them: a cached total whose track is gone is gathered again, never
// served wrong. Under View.mu; each sweep frees a quarter of the limit,
// so that their cost per new track stays constant.
func (ts *tracks) sweep(now time.Time, keep time.Duration) {
	old := now.Add(-2 * keep).UnixNano()
	for topic, t := range ts.topics {
		if t.used.Load() < old {
			t.gone.Store(true)
			delete(ts.topics, topic)
		}
	}
	for topic, t := range ts.topics {
		if len(ts.topics) < ts.limit*3/4 {
			break
		}
		t.gone.Store(true)
		delete(ts.topics, topic)
	}
}

// land records a landing of topic, if a reader gathered it lately; the
// landings no cached total can need any more go. Under View.mu.
func (ts *tracks) land(topic string, l landing, keep time.Duration) {
	t, ok := ts.topics[topic]
	if !ok {
		return
	}
	cut := 0
	for cut < len(t.landings) && (l.landed.Sub(t.landings[cut].landed) > 2*keep || len(t.landings)-cut >= maxLandings) {
		cut++
	}
	if cut > 0 {
		t.landings = append(t.landings[:0], t.landings[cut:]...)
		t.first += uint64(cut)
	}
	t.landings = append(t.landings, l)
	t.n.Store(t.first + uint64(len(t.landings)))
}
