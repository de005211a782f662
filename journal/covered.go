package journal

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// coverage is a live copy of which messages the journal's entries carry,
// for Covered. A redelivery, and in a partition lane's first seconds every
// delivery, asks it; reading the bucket for each (a listing and a get per
// entry, every two seconds, as before) cost so many requests on a busy
// machine that the look-ups ran out of time, the deliveries were handed
// back, and a partition's counting stalled for tens of seconds. A watcher
// of the bucket (one ordered consumer) keeps the copy instead: its owner
// is Journal.Watch, and Covered reads memory.
type coverage struct {
	mu     sync.Mutex
	ranges map[string][][2]int64 // entry key -> the messages it carries
	noted  map[string][][2]int64 // own entries noted since the watch began
	ready  chan struct{}         // closed once the first watch has read every entry
	once   sync.Once
}

func newCoverage() *coverage {
	return &coverage{ranges: make(map[string][][2]int64), ready: make(chan struct{})}
}

// covered says whether an entry carries the message at position seq,
// waiting (within ctx) for the watch's first reading.
func (c *coverage) covered(ctx context.Context, seq int64) (bool, error) {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return false, fmt.Errorf("journal: entries not read yet: %w", ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range c.ranges {
		for _, r := range rs {
			if seq >= r[0] && seq <= r[1] {
				return true, nil
			}
		}
	}
	return false, nil
}

// note puts one of this writer's own entries in the copy as it is
// recorded, without waiting for the watch to bring it back.
func (c *coverage) note(key string, seqs [][2]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ranges[key] = seqs
	if c.noted != nil {
		c.noted[key] = seqs
	}
}

// watch keeps the copy until ctx ends, watching again (after a second)
// whenever a watch ends early. A new watch's reading replaces the copy
// once complete; until then the last one answers.
func (c *coverage) watch(ctx context.Context, kv jetstream.KeyValue, log *zap.Logger) {
	for ctx.Err() == nil {
		if err := c.watchOnce(ctx, kv); err != nil && ctx.Err() == nil {
			log.Warn("journal watch ended; watching again", zap.Error(err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (c *coverage) watchOnce(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("journal: watch: %w", err)
	}
	defer w.Stop()                      //nolint:errcheck // the watch's end
	next := make(map[string][][2]int64) // the reading under way
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return fmt.Errorf("journal: watch closed")
			case e == nil: // every entry there when the watch began is read
				c.mu.Lock()
				// Entries recorded here since the watch began come
				// through it only now: keep them meanwhile.
				for k, v := range c.noted {
					if _, ok := next[k]; !ok {
						next[k] = v
					}
				}
				c.ranges, next, c.noted = next, nil, nil
				c.mu.Unlock()
				c.once.Do(func() { close(c.ready) })
			case next != nil:
				apply(next, e)
			default:
				c.mu.Lock()
				apply(c.ranges, e)
				c.mu.Unlock()
			}
		}
	}
}

// apply puts one change of the bucket into ranges. An entry that cannot be
// decoded carries nothing readable (Replay logs it).
func apply(ranges map[string][][2]int64, e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		delete(ranges, e.Key())
		return
	}
	var seqs struct {
		Seqs [][2]int64 `json:"seqs"`
	}
	if json.Unmarshal(e.Value(), &seqs) != nil {
		delete(ranges, e.Key())
		return
	}
	ranges[e.Key()] = seqs.Seqs
}
