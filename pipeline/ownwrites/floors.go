package ownwrites

import (
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"

	"github.com/hotcount/hotcount/internal/clockcache"
)

// floors hold, per topic, the highest totals served, plain and with
// pending mentions, for Keep from the first: the next is never lower,
// whatever a lagging replica says meanwhile, and a total that was wrong
// (too high) is not held longer than that.
type floors struct {
	c *otter.Cache[string, *floor]
}

// floor is a topic's highest totals served: plain, and with pending
// mentions.
type floor struct{ plain, pending atomic.Int64 }

func newFloors(cfg Config, now func() time.Time) floors {
	return floors{c: otter.Must(&otter.Options[string, *floor]{
		MaximumSize:      cfg.Topics,
		ExpiryCalculator: otter.ExpiryWriting[string, *floor](cfg.Keep),
		Clock:            clockcache.Clock{Now: now}, // never ticks: CleanUp drops the old
	})}
}

func (f floors) cleanUp() { f.c.CleanUp() }

// Floor returns count, or the highest total served of topic before (with
// pending mentions, or without) if that is higher, and remembers it.
func (v *View) Floor(topic string, count int64, pending bool) int64 {
	fl, ok := v.floors.c.GetIfPresent(topic) // a read, where a compute would lock the hot topic's entry
	if !ok {
		fl, _ = v.floors.c.ComputeIfAbsent(topic, func() (*floor, bool) { return new(floor), false })
	}
	x := &fl.plain
	if pending {
		x = &fl.pending
	}
	for {
		seen := x.Load()
		if count <= seen {
			return seen
		}
		if x.CompareAndSwap(seen, count) {
			return count
		}
	}
}
