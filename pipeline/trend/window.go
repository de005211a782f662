// Package trend answers questions about time: how many mentions a topic had
// in the last window (GET /v1/topics/{topic}?window=15m), its counts bucket
// by bucket (/series), and which topics are trending across the fleet
// (/v1/trending).
//
// Counts come from the minute and hour buckets the flusher writes (see
// schema.BucketKey): a window is read as the buckets that cover it, at
// minute resolution up to Config.MinuteSpan and hour resolution beyond, each
// bucket summed over the topic's shards, in BatchGetItem calls of 100 keys.
// Results are cached like totals, for the cache TTL.
//
// Trending candidates come from the whole fleet: every sidecar publishes
// what each flush wrote per minute (Summary) and every sidecar merges the
// summaries into the same sketch, so each ranks the same candidates; their
// exact counts then come from the buckets.
package trend

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// ErrBadRequest marks an error in what the caller asked (a 400).
var ErrBadRequest = errors.New("bad request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// ParseWindow reads a window or a step: a whole, positive number of
// minutes, hours or days ("1m", "15m", "24h", "7d").
func ParseWindow(s string) (time.Duration, error) {
	if len(s) < 2 {
		return 0, badRequest("window %q is not a whole number of minutes, hours or days (1m, 15m, 1h, 24h, 7d)", s)
	}
	n, err := strconv.Atoi(s[:len(s)-1])
	if err != nil || n < 1 || strings.HasPrefix(s, "+") {
		return 0, badRequest("window %q is not a whole number of minutes, hours or days (1m, 15m, 1h, 24h, 7d)", s)
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 'm':
		unit = time.Minute
	case 'h':
		unit = time.Hour
	case 'd':
		unit = 24 * time.Hour
	default:
		return 0, badRequest("window %q is not a whole number of minutes, hours or days (1m, 15m, 1h, 24h, 7d)", s)
	}
	if n > int(MaxWindow/unit) {
		return 0, badRequest("window %q is longer than %s, more than any bucket is kept", s, FormatWindow(MaxWindow))
	}
	return time.Duration(n) * unit, nil
}

// MaxWindow bounds a window or a step: the longest --hour-retention.
const MaxWindow = 400 * 24 * time.Hour

// FormatWindow writes d as ParseWindow reads it, in its largest whole unit.
func FormatWindow(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	}
	return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
}

// Span is the buckets that cover a window: buckets First..Last of G, the
// first the one now − window falls in, the last the one now falls in. The
// interval covered is From (the first bucket's start) to To (now): the
// whole window, and at most one bucket more before it.
type Span struct {
	G           schema.Granularity
	First, Last int64
	From, To    time.Time
}

// Buckets is the number of buckets in s.
func (s Span) Buckets() int { return int(s.Last - s.First + 1) }

// granularity picks the resolution a window of length d is read at: minutes
// up to MinuteSpan (or whenever hours are off), hours beyond.
func (c Config) granularity(d time.Duration) (schema.Granularity, error) {
	switch {
	case !c.Minutes && !c.Hours:
		return 0, badRequest("time buckets are off here (--windows none): no windowed counts")
	case c.Minutes && (d <= min(c.minuteSpan(), c.Retention.Of(schema.Minute)) || !c.Hours):
		return schema.Minute, nil
	}
	return schema.Hour, nil
}

func (c Config) minuteSpan() time.Duration {
	if c.MinuteSpan > 0 {
		return c.MinuteSpan
	}
	return DefaultMinuteSpan
}

// span returns the buckets of g covering the window of length d up to now,
// checked against g's retention.
func (c Config) span(g schema.Granularity, d time.Duration, now time.Time) (Span, error) {
	s := Span{G: g, First: g.Index(now.Add(-d)), Last: g.Index(now), To: now}
	s.From = g.Start(s.First)
	if keep := c.Retention.Of(g); !kept(g, s.First, keep, now) {
		return Span{}, badRequest("window %s reaches back past the %s buckets' retention (%s): choose a shorter window", FormatWindow(d), g, keep)
	}
	if s.Buckets() > maxReadBuckets {
		return Span{}, badRequest("window %s at %s resolution is %d buckets, more than %d", FormatWindow(d), g, s.Buckets(), maxReadBuckets)
	}
	return s, nil
}

// kept says whether bucket i of g, kept for keep after its end (its
// expiresAt), is still stored at now.
func kept(g schema.Granularity, i int64, keep time.Duration, now time.Time) bool {
	return g.Start(i + 1).Add(keep).After(now)
}

// plan is the span a windowed count of length d reads.
func (c Config) plan(d time.Duration, now time.Time) (Span, error) {
	g, err := c.granularity(d)
	if err != nil {
		return Span{}, err
	}
	return c.span(g, d, now)
}
