// Package ceiling emulates DynamoDB's throughput ceiling per partition key
// (1,000 write and 3,000 read units a second, with a burst): a token
// bucket per key. It is the one emulation of it in the tree: the fault
// proxy (internal/testtools/ddbfault) puts it in front of a DynamoDB API in the
// tests, and Store puts it in front of a store for `hotcount demo` and the
// console's race, which must not compile the fault proxy into the binary.
package ceiling

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/hotcount/hotcount/pipeline/store"
)

// Keys is a ceiling per key: each key may spend perSecond units a second,
// and burst at once. Safe for concurrent use.
type Keys struct {
	perSecond rate.Limit
	burst     int

	mu   sync.Mutex
	lims map[string]*rate.Limiter
	// latest is the latest time taken at: rate.Limiter grants the time
	// between two takes again when one goes back in time (concurrent
	// callers read their clocks before they queue for mu), so a take is
	// never earlier than the one before it.
	latest time.Time
}

// New returns a ceiling of perSecond units a second per key, burst at
// once (at least 1). perSecond <= 0: no ceiling, Take always succeeds.
func New(perSecond float64, burst int) *Keys {
	return &Keys{perSecond: rate.Limit(perSecond), burst: max(burst, 1), lims: make(map[string]*rate.Limiter)}
}

// Take takes one unit from each key's bucket at now, all or nothing (a
// request over several keys, such as a BatchGetItem, is refused whole
// when one key is over its ceiling, and then takes nothing from the
// others). False: refused.
func (k *Keys) Take(now time.Time, keys ...string) bool {
	if k.perSecond <= 0 || len(keys) == 0 {
		return true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if now.Before(k.latest) {
		now = k.latest
	}
	k.latest = now
	var taken []*rate.Reservation
	for _, key := range keys {
		l, ok := k.lims[key]
		if !ok {
			l = rate.NewLimiter(k.perSecond, k.burst)
			k.lims[key] = l
		}
		r := l.ReserveN(now, 1)
		if !r.OK() || r.DelayFrom(now) > 0 {
			r.CancelAt(now)
			for _, t := range taken {
				t.CancelAt(now)
			}
			return false
		}
		taken = append(taken, r)
	}
	return true
}

// Adder is the store a Store writes through.
type Adder interface {
	Add(ctx context.Context, w store.Write, now time.Time) error
}

// Counts are what a Store let through and refused.
type Counts struct {
	Mentions  int64 `json:"mentions"`  // the deltas of the writes applied
	Writes    int64 `json:"writes"`    // writes applied
	Throttled int64 `json:"throttled"` // writes refused for the ceiling
}

// Store is a store behind a write ceiling per item: a write over its
// item's ceiling is refused as DynamoDB refuses it (an error wrapping
// store.ErrThrottled, nothing applied), so that the flusher moves the
// delta to another shard or keeps it for the next flush. Safe for
// concurrent use.
type Store struct {
	keys *Keys
	next Adder // nil: keep nothing but the counts

	mentions, writes, throttled atomic.Int64
}

// NewStore puts keys in front of next (nil: a store that only counts what
// it accepts).
func NewStore(keys *Keys, next Adder) *Store { return &Store{keys: keys, next: next} }

// Add applies w through the ceiling.
func (s *Store) Add(ctx context.Context, w store.Write, now time.Time) error {
	if !s.keys.Take(now, w.Key()) {
		s.throttled.Add(1)
		return fmt.Errorf("ceiling: %s is over %.0f writes/s: %w", w.Key(), float64(s.keys.perSecond), store.ErrThrottled)
	}
	if s.next != nil {
		if err := s.next.Add(ctx, w, now); err != nil {
			return err
		}
	}
	s.writes.Add(1)
	s.mentions.Add(w.Delta)
	return nil
}

// Counts says what s let through and refused so far.
func (s *Store) Counts() Counts {
	return Counts{Mentions: s.mentions.Load(), Writes: s.writes.Load(), Throttled: s.throttled.Load()}
}
