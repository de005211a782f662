// Package clockcache builds otter caches that keep time by an injected
// clock and start nothing: the shard counts, the lookup totals and the
// trend answers all expire by the process's clock (a test steps it), and
// none of them runs a goroutine of its own.
package clockcache

import (
	"time"

	"github.com/maypok86/otter/v2"
)

// Clock is otter's clock on now. It never ticks, so otter's periodic
// clean-up goroutine returns at once: expired entries are never served,
// and are dropped by the maintenance that reads and writes run.
type Clock struct{ Now func() time.Time }

// NowNano is now in nanoseconds.
func (c Clock) NowNano() int64 { return c.Now().UnixNano() }

// Tick returns no ticks: no periodic clean-up (see Clock).
func (Clock) Tick(time.Duration) <-chan time.Time { return nil }

// New returns a cache of at most size entries, each kept for ttl from its
// last write by now's time. Its maintenance runs on the goroutine that
// reads or writes, which otter allows of a cache whose functions never
// call it back (no deletion listener; a loader passed to Get must not
// write the cache).
func New[K comparable, V any](size int, ttl time.Duration, now func() time.Time) *otter.Cache[K, V] {
	return otter.Must(&otter.Options[K, V]{
		MaximumSize:      max(size, 1),
		ExpiryCalculator: otter.ExpiryWriting[K, V](ttl),
		Clock:            Clock{now},
		Executor:         func(fn func()) { fn() },
	})
}
