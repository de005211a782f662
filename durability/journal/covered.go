package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/hotcount/hotcount/internal/waits"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
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

	backOff func() backoff.BackOff // the waits before watching again (watchBackOff)
	read    func()                 // called as each watch's reading is complete; nil: none (a test's)
}

func newCoverage() *coverage {
	return &coverage{ranges: make(map[string][][2]int64), ready: make(chan struct{}), backOff: watchBackOff}
}

// watchBackOff is the wait before watching again: a second after a watch
// that had read the bucket ends, then growing while watches keep failing
// (the bucket or its server gone), up to 10 s, so that a long outage costs
// a request every few seconds while the copy returns soon after it.
func watchBackOff() backoff.BackOff { return waits.Watch() }

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

// watch keeps the copy until ctx ends, watching again whenever a watch
// ends early, after watchBackOff's wait: from its first again once a watch
// had read the bucket. It returns as soon as ctx ends, waiting or not. A
// new watch's reading replaces the copy once complete; until then the
// last one answers.
func (c *coverage) watch(ctx context.Context, kv jetstream.KeyValue, log *zap.Logger) {
	b := c.backOff()
	backoff.Retry(ctx, func() (struct{}, error) { //nolint:errcheck // it ends with ctx alone
		read, err := c.watchOnce(ctx, kv)
		if ctx.Err() != nil {
			return struct{}{}, nil
		}
		if read {
			b.Reset() // it worked: the bucket is there
		}
		if err == nil {
			err = errors.New("journal: watch ended")
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, wait time.Duration) {
		log.Warn("journal watch ended; watching again", zap.Error(err), zap.Duration("in", wait))
	}))
}

// watchOnce runs one watch until it or ctx ends, and says whether it read
// the whole bucket.
func (c *coverage) watchOnce(ctx context.Context, kv jetstream.KeyValue) (read bool, err error) {
	// This writer's entries recorded from now on, the watch's start
	// included, may come through it only after its reading is complete:
	// note keeps them, so that the new copy does not lose them meanwhile
	// (a covered message read as not covered could be counted twice). One
	// retired meanwhile may come back until its deletion comes through:
	// covered, which is true of a retired entry's messages (they are in
	// the store).
	c.mu.Lock()
	c.noted = make(map[string][][2]int64)
	c.mu.Unlock()
	w, err := kv.WatchAll(ctx)
	if err != nil {
		c.mu.Lock()
		c.noted = nil // no reading to keep them for
		c.mu.Unlock()
		return false, fmt.Errorf("journal: watch: %w", err)
	}
	defer w.Stop()                      //nolint:errcheck // the watch's end
	next := make(map[string][][2]int64) // the reading under way
	for {
		select {
		case <-ctx.Done():
			return read, nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return read, fmt.Errorf("journal: watch closed")
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
				read = true
				if c.read != nil {
					c.read()
				}
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
