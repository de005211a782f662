package console

import (
	"sync"
	"time"
)

// shardsRead is /v1/topics/{topic}/shards's answer.
type shardsRead struct {
	Count  int64   `json:"count"`
	Shards []shard `json:"shards"`
	// ReadAt is when it was read (Unix ms): the bars are that old.
	ReadAt int64 `json:"readAt"`
}

type shard struct {
	Shard     int   `json:"shard"`
	Count     int64 `json:"count"`
	UpdatedAt int64 `json:"updatedAt"`
}

// maxCached bounds the topics whose shards are kept: entries live a
// second, so this is the distinct topics viewed per second it covers;
// past it a read is not kept (it costs what the shards endpoint costs).
const maxCached = 256

// shardCache keeps each topic's shards for ttl and shares a read under
// way with every viewer who asks meanwhile. It is safe for concurrent use.
type shardCache struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[string]*shardEntry
}

// shardEntry is one read: ready is closed when read and err are set, and
// they do not change afterwards.
type shardEntry struct {
	ready chan struct{}
	read  shardsRead
	at    time.Time
	err   error
}

func (e *shardEntry) fresh(now time.Time, ttl time.Duration) bool {
	select {
	case <-e.ready:
		return e.err == nil && now.Sub(e.at) < ttl
	default:
		return true // under way: join it
	}
}

func newShardCache(ttl time.Duration, now func() time.Time) *shardCache {
	return &shardCache{ttl: ttl, now: now, entries: make(map[string]*shardEntry)}
}

// get returns topic's shards as read less than ttl ago, or reads them with
// load, once for every caller that asks while it runs.
func (c *shardCache) get(topic string, load func() (shardsRead, error)) (shardsRead, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[topic]
	if !ok || !e.fresh(now, c.ttl) {
		e = &shardEntry{ready: make(chan struct{})}
		if len(c.entries) >= maxCached {
			for t, old := range c.entries {
				if !old.fresh(now, c.ttl) {
					delete(c.entries, t)
				}
			}
		}
		if len(c.entries) < maxCached {
			c.entries[topic] = e
		}
		c.mu.Unlock()
		e.read, e.err = load()
		e.at = c.now()
		e.read.ReadAt = e.at.UnixMilli()
		close(e.ready)
		return e.read, e.err
	}
	c.mu.Unlock()
	<-e.ready
	return e.read, e.err
}
