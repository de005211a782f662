package config

import (
	"regexp"
	"strings"
	"time"
)

// trendFlags are the time buckets and the flush summaries behind
// /v1/trending, and its moderation.
var trendFlags = []setting{
	{name: "windows", usage: "time buckets counted besides each topic's total, for ?window= reads and /v1/trending: 1m,1h (dev's default), 1m, 1h, or none (run's default); each costs one more write per busy topic per flush", bind: str(func(c *Config) *string { return &c.Windows })},
	{name: "minute-retention", usage: "how long minute buckets are kept (their DynamoDB TTL); windows up to 3h (and up to this) read minutes, longer ones hours", bind: dur(func(c *Config) *time.Duration { return &c.MinuteRetention })},
	{name: "hour-retention", usage: "how long hour buckets are kept (their DynamoDB TTL): the longest window", bind: dur(func(c *Config) *time.Duration { return &c.HourRetention })},
	{name: "trending-by", usage: "what /v1/trending ranks by: mentions (each mention counts) or contributors (each contributor named by a mention's \"by\" counts once a minute, and a topic needs --trending-min-contributors to be listed)", bind: str(func(c *Config) *string { return &c.TrendingBy })},
	{name: "trending-min-contributors", usage: "the least distinct contributors a topic needs in the window to trend by contributors", bind: integer(func(c *Config) *int { return &c.TrendingMinContributors })},
	{name: "trend-subject", usage: "subject the sidecars publish each flush's summary on, from which every sidecar ranks /v1/trending for the whole fleet", bind: str(func(c *Config) *string { return &c.TrendSubject })},
	{name: "trending-bucket", usage: "JetStream key-value bucket of the fleet's trending moderation: topics hidden from /v1/trending or allowed onto it, and those waiting for review (hotcount trending)", bind: str(func(c *Config) *string { return &c.TrendingBucket })},
	{name: "trending-review", usage: "list a topic in /v1/trending only once an operator has allowed it (hotcount trending allow); the others wait, listed by hotcount trending list. Needs JetStream", bind: boolean(func(c *Config) *bool { return &c.TrendingReview })},
}

// bucketName is a JetStream key-value bucket's name.
var bucketName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// checkWindows checks the time buckets, their retention, the subject
// their flush summaries go out on, which must stay out of the subscription
// (prefix), and the trending list's moderation.
func (c *Config) checkWindows(p *problems, prefix string) {
	if c.Windows != "none" {
		for _, w := range strings.Split(c.Windows, ",") {
			if w := strings.TrimSpace(w); w != "1m" && w != "1h" {
				p.bad("windows", "%q is not a list of 1m and 1h, or none", c.Windows)
				break
			}
		}
	}
	p.durIn("minute-retention", c.MinuteRetention, time.Hour, 30*24*time.Hour)
	p.durIn("hour-retention", c.HourRetention, 24*time.Hour, 400*24*time.Hour)
	if c.TrendingBy != TrendingByMentions && c.TrendingBy != TrendingByContributors {
		p.bad("trending-by", "%q is neither mentions nor contributors", c.TrendingBy)
	}
	p.intIn("trending-min-contributors", int64(c.TrendingMinContributors), 1, 1_000_000)
	if c.TrendSubject == "" || strings.ContainsAny(c.TrendSubject, "*> \t") {
		p.bad("trend-subject", "%q is not a plain NATS subject", c.TrendSubject)
	} else if prefix != "" && strings.HasPrefix(c.TrendSubject, prefix) {
		p.bad("trend-subject", "%q is under the subscription %q: summaries would come back as mentions", c.TrendSubject, c.Subject)
	}
	if !bucketName.MatchString(c.TrendingBucket) {
		p.bad("trending-bucket", "%q is not a key-value bucket name (letters, digits, - and _)", c.TrendingBucket)
	}
	if minutes, _ := c.Buckets(); c.TrendingReview && !minutes {
		p.bad("trending-review", "there is no trending list to review without minute buckets (--windows %s): add 1m", c.Windows)
	}
}
