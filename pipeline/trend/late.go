package trend

import (
	"sync"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// lateBook remembers when buckets that had settled were written to again:
// by a backfill (mentions whose "at" is old), a redelivery, a flush retried
// after an outage. A settled bucket's count read before such a write is
// stale, so a cached count is used only if it was read after the bucket's
// last late write (Service.readManyWithin). It learns of late writes from
// the fleet's summaries (Sketch.Merge) and this sidecar's own flushes
// (Service.Observe). It is safe for concurrent use.
type lateBook struct {
	mu     sync.Mutex
	marks  map[bucketID]time.Time // the last late write heard of, by bucket
	pruned time.Time              // when marks older than lateKeep last went
}

type bucketID struct {
	g schema.Granularity
	i int64
}

// lateKeep is how long a mark is kept: longer than a cached count lives
// (settledTTL), so that no count read before the mark outlives it.
const lateKeep = 2 * settledTTL

func newLateBook() *lateBook { return &lateBook{marks: make(map[bucketID]time.Time)} }

// settled says whether bucket i of g had settled at now: it ended over
// settleAfter ago, so only late mentions still change it.
func settled(g schema.Granularity, i int64, now time.Time) bool {
	return !g.Start(i + 1).After(now.Add(-settleAfter))
}

// wrote notes that bucket i of g was written at now, if it had settled.
func (b *lateBook) wrote(g schema.Granularity, i int64, now time.Time) {
	if b == nil || !settled(g, i, now) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.pruned) > time.Minute {
		for id, at := range b.marks {
			if now.Sub(at) > lateKeep {
				delete(b.marks, id)
			}
		}
		b.pruned = now
	}
	b.marks[bucketID{g, i}] = now
}

// wroteMinute notes a late write to minute i, and so to its hour.
func (b *lateBook) wroteMinute(i int64, now time.Time) {
	b.wrote(schema.Minute, i, now)
	b.wrote(schema.Hour, schema.Hour.Index(schema.Minute.Start(i)), now)
}

// since returns the last late write to bucket i of g heard of (zero: none
// in the last lateKeep).
func (b *lateBook) since(g schema.Granularity, i int64) time.Time {
	if b == nil {
		return time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.marks[bucketID{g, i}]
}
