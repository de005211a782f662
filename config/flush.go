package config

import (
	"fmt"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// flushFlags are the shards, the flush's timing and the bounds on what one
// mention may carry.
var flushFlags = []setting{
	{name: "shards", usage: fmt.Sprintf("shards of a new topic, 1..%d (a topic keeps the count recorded when it was first written: see docs/SIZING.md)", schema.MaxShards), bind: integer(func(c *Config) *int { return &c.Shards })},
	{name: "adaptive", usage: "double a topic's shards (up to max-shards) when its writes are throttled (on by default; --adaptive=false keeps every topic at its first count)", bind: boolean(func(c *Config) *bool { return &c.Adaptive })},
	{name: "max-shards", usage: "the most shards --adaptive raises a topic to", bind: integer(func(c *Config) *int { return &c.MaxShards })},
	{name: "shards-cache", usage: "how long a writer trusts its copy of a topic's shard count, and the least time between two raises of a topic by one sidecar", bind: dur(func(c *Config) *time.Duration { return &c.ShardsCache })},
	{name: "flush-interval", usage: "how often buffered deltas are written (±10% jitter)", bind: dur(func(c *Config) *time.Duration { return &c.FlushInterval })},
	{name: "flush-timeout", usage: "how long one flush may go on starting writes; the rest wait for the next flush", bind: dur(func(c *Config) *time.Duration { return &c.FlushTimeout })},
	{name: "write-timeout", usage: "how long one store write may take, the SDK's retries included; a write that runs out is in doubt and is sent again unchanged", bind: dur(func(c *Config) *time.Duration { return &c.WriteTimeout })},
	{name: "quarantine-after", usage: "how long a counter's writes may be refused for good (AccessDenied, Validation, overflow), never in doubt, before the write moves to the quarantine (the data directory in core mode, a JetStream bucket otherwise) and stops holding its topic; 0: never, tried forever", bind: dur(func(c *Config) *time.Duration { return &c.QuarantineAfter })},
	{name: "flush-concurrency", usage: "the most writes in flight at once during a flush (a flush runs as many as it has topics, up to this); 0: 256 against DynamoDB, 1024 against the embedded store, whose writes in flight commit together", bind: integer(func(c *Config) *int { return &c.FlushConcurrency })},
	{name: "max-topics", usage: "distinct topics in one window before an early flush", bind: integer(func(c *Config) *int { return &c.MaxTopics })},
	{name: "max-count", usage: "largest count one message may add", bind: integer64(func(c *Config) *int64 { return &c.MaxCount })},
	{name: "max-topic-bytes", usage: "longest topic accepted, in bytes", bind: integer(func(c *Config) *int { return &c.MaxTopicBytes })},
	{name: "max-lateness", usage: `how long before its arrival (core mode) or publication (jetstream, partitioned) a mention's "at" may be; an older one, or one over a minute ahead, is rejected (reason "at"); 0: 24h, or the minute-retention if shorter with 1m windows`, bind: dur(func(c *Config) *time.Duration { return &c.MaxLateness })},
}

// checkFlush checks the shards, the flush's timing and the bounds on what
// one mention may carry.
func (c *Config) checkFlush(p *problems) {
	p.intIn("shards", int64(c.Shards), 1, schema.MaxShards)
	p.intIn("max-shards", int64(c.MaxShards), 1, schema.MaxShards)
	p.durIn("shards-cache", c.ShardsCache, 10*time.Millisecond, time.Hour)
	p.durIn("flush-interval", c.FlushInterval, 10*time.Millisecond, time.Hour)
	p.durIn("flush-timeout", c.FlushTimeout, time.Millisecond, time.Hour)
	p.durIn("write-timeout", c.WriteTimeout, 10*time.Millisecond, time.Minute)
	if c.QuarantineAfter != 0 {
		p.durIn("quarantine-after", c.QuarantineAfter, time.Second, 7*24*time.Hour)
	}
	p.intIn("flush-concurrency", int64(c.FlushConcurrency), 0, 1024)
	p.intIn("max-topics", int64(c.MaxTopics), 1, 100_000_000)
	p.intIn("max-count", c.MaxCount, 1, 1<<53)
	p.intIn("max-topic-bytes", int64(c.MaxTopicBytes), 1, 1024)
	p.durIn("max-lateness", c.MaxLateness, 0, 400*24*time.Hour)
	if minutes, hours := c.Buckets(); c.MaxLateness > 0 {
		// A mention older than its buckets' retention would go to a bucket
		// already expired: refused, rather than counted where no read finds it.
		switch {
		case minutes && c.MaxLateness > c.MinuteRetention:
			p.bad("max-lateness", "%s is longer than minute-retention %s: a mention that late would land in an expired minute bucket", c.MaxLateness, c.MinuteRetention)
		case hours && c.MaxLateness > c.HourRetention:
			p.bad("max-lateness", "%s is longer than hour-retention %s: a mention that late would land in an expired hour bucket", c.MaxLateness, c.HourRetention)
		}
	}
}
