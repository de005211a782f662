package console

import (
	"context"
	"sync"
	"time"

	"github.com/hotcount/hotcount/tools/ceiling"
	"github.com/hotcount/hotcount/tools/racer"
)

// The race is tools/racer's, as `hotcount demo` runs it, made live and
// self-contained: the per-key ceiling (tools/ceiling) is in front of a
// store that only counts what it accepts. Nothing reaches the sidecar's
// store or its metrics.

// raceTopic is the one hot topic of a race, in the race's own store.
const raceTopic = "race"

// raceParams is what a race runs.
type raceParams struct {
	// Shards is the shard count both writers write the topic on.
	Shards int
	// Ceiling is the emulated write units per second per key, and Burst
	// what a key takes at once: DynamoDB's is 1,000/s, scaled down as
	// make demo does so that a laptop reaches it.
	Ceiling float64
	Burst   int
	// Writers each offer Offered/Writers mentions a second, in each mode.
	Writers int
	Offered float64
	// FlushInterval is the coalescing flusher's interval.
	FlushInterval time.Duration
	// Duration is how long a race runs.
	Duration time.Duration
}

// defaultRace is the race the button starts: 2,000 mentions/s offered
// both ways against a ceiling of 100 writes/s on one key, for 30 s.
// Direct, each mention is a write and 95% are throttled; coalesced, ten
// writes a second carry them all.
func defaultRace() raceParams {
	return raceParams{Shards: 1, Ceiling: 100, Burst: 10, Writers: 8, Offered: 2000,
		FlushInterval: 100 * time.Millisecond, Duration: 30 * time.Second}
}

// race is one race: written by its run, read by the page's polls.
type race struct {
	p                 raceParams
	started           time.Time
	direct, coalesced *ceiling.Store

	mu     sync.Mutex
	points []racePoint
	ended  time.Time // zero while it runs
}

// racePoint is one second of a race, per second.
type racePoint struct {
	T                  int64  `json:"t"` // ms since the start
	Direct             number `json:"direct"`
	Coalesced          number `json:"coalesced"`
	DirectThrottled    number `json:"directThrottled"`
	CoalescedThrottled number `json:"coalescedThrottled"`
	DirectWrites       number `json:"directWrites"`
	CoalescedWrites    number `json:"coalescedWrites"`
}

func newRace(p raceParams, now time.Time) *race {
	return &race{p: p, started: now,
		direct: ceiling.NewStore(ceiling.New(p.Ceiling, p.Burst), nil), coalesced: ceiling.NewStore(ceiling.New(p.Ceiling, p.Burst), nil)}
}

// run races until the race's duration has passed or ctx ends, and returns
// once every goroutine it started has stopped.
func (r *race) run(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, r.p.Duration)
	defer cancel()
	c := racer.Config{Topic: raceTopic, Shards: r.p.Shards, Writers: r.p.Writers, FlushInterval: r.p.FlushInterval,
		Every: time.Duration(float64(time.Second) * float64(r.p.Writers) / r.p.Offered)}
	var wg sync.WaitGroup
	// A throttled direct mention is lost, as the app's would be; the
	// store counts it.
	wg.Go(func() { racer.Direct(ctx, c, r.direct, func(error) bool { return true }) })
	wg.Go(func() { racer.Coalesced(ctx, parent, c, r.coalesced, 2*time.Second) })
	wg.Go(func() { r.record(ctx) })
	wg.Wait()
	r.mu.Lock()
	r.ended = time.Now()
	r.mu.Unlock()
}

// record adds a point each second, and a last one when the race ends.
func (r *race) record(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, lastAt := [2]ceiling.Counts{}, r.started
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			now = time.Now()
		case now = <-t.C:
		}
		cur := [2]ceiling.Counts{r.direct.Counts(), r.coalesced.Counts()}
		dt := now.Sub(lastAt).Seconds()
		per := func(x, y int64) number { return number(float64(y-x) / dt) }
		if dt > 0.1 { // skip a sliver at the end
			r.mu.Lock()
			r.points = append(r.points, racePoint{
				T:                  now.Sub(r.started).Milliseconds(),
				Direct:             per(last[0].Mentions, cur[0].Mentions),
				Coalesced:          per(last[1].Mentions, cur[1].Mentions),
				DirectThrottled:    per(last[0].Throttled, cur[0].Throttled),
				CoalescedThrottled: per(last[1].Throttled, cur[1].Throttled),
				DirectWrites:       per(last[0].Writes, cur[0].Writes),
				CoalescedWrites:    per(last[1].Writes, cur[1].Writes),
			})
			r.mu.Unlock()
		}
		if ctx.Err() != nil {
			return
		}
		last, lastAt = cur, now
	}
}

// raceState is a race as the page shows it.
type raceState struct {
	Running         bool           `json:"running"`
	ElapsedMs       int64          `json:"elapsedMs"`
	DurationMs      int64          `json:"durationMs"`
	Shards          int            `json:"shards"`
	Ceiling         float64        `json:"ceiling"`
	Offered         float64        `json:"offered"`
	Writers         int            `json:"writers"`
	FlushIntervalMs int64          `json:"flushIntervalMs"`
	Direct          ceiling.Counts `json:"direct"`
	Coalesced       ceiling.Counts `json:"coalesced"`
	Points          []racePoint    `json:"points"`
}

func (r *race) snapshot(now time.Time) *raceState {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := now
	if !r.ended.IsZero() {
		end = r.ended
	}
	return &raceState{
		Running: r.ended.IsZero(), ElapsedMs: end.Sub(r.started).Milliseconds(), DurationMs: r.p.Duration.Milliseconds(),
		Shards: r.p.Shards, Ceiling: r.p.Ceiling, Offered: r.p.Offered, Writers: r.p.Writers,
		FlushIntervalMs: r.p.FlushInterval.Milliseconds(),
		Direct:          r.direct.Counts(), Coalesced: r.coalesced.Counts(),
		Points: append([]racePoint(nil), r.points...),
	}
}
