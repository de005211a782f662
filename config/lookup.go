package config

import "time"

// lookupFlags are the lookup API's cache of gathered totals.
var lookupFlags = []setting{
	{name: "cache-ttl", usage: "how long a gathered total is served from the cache", bind: dur(func(c *Config) *time.Duration { return &c.CacheTTL })},
	{name: "cache-stale", usage: "past the TTL, a total is served stale while one background gather refreshes it, up to this age (0: 10 × cache-ttl)", bind: dur(func(c *Config) *time.Duration { return &c.CacheStale })},
	{name: "cache-size", usage: "topics whose totals the cache holds", bind: integer(func(c *Config) *int { return &c.CacheSize })},
}

// checkCache checks the lookup API's cache of gathered totals.
func (c *Config) checkCache(p *problems) {
	p.durIn("cache-ttl", c.CacheTTL, time.Millisecond, time.Hour)
	if c.CacheStale != 0 && c.CacheStale < c.CacheTTL {
		p.bad("cache-stale", "%s is shorter than cache-ttl %s (0 means 10 × cache-ttl)", c.CacheStale, c.CacheTTL)
	}
	p.durIn("cache-stale", c.CacheStale, 0, 24*time.Hour)
	p.intIn("cache-size", int64(c.CacheSize), 1, 100_000_000)
}
