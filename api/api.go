// Package api holds the lookup API's wire types: the JSON answers of
// /v1/topics, /v1/trending and their kin, as the sidecar serves them and
// package client reads them. It needs nothing but the standard library, so
// that a program that only reads counts compiles nothing of the sidecar.
package api

import "time"

// MaxBatch is the most topics one batch lookup may name.
const MaxBatch = 100

// Total is a topic's total as a sidecar serves it (GET /v1/topics/{topic}).
type Total struct {
	Topic string `json:"topic"`
	Count int64  `json:"count"`
	// Source is "cache" or "store".
	Source string `json:"source"`
	// Stale says the total is older than the sidecar's --cache-ttl: a
	// refresh is under way, or the last one failed.
	Stale bool `json:"stale"`
	// AgeMs is how long ago, in milliseconds, the total was gathered.
	AgeMs int64 `json:"ageMs"`
	// Shards is how many shards were summed.
	Shards int `json:"shards"`
	// Saturated says the sum passed the int64 range and is capped.
	Saturated bool `json:"saturated,omitempty"`
	// Pending is the sidecar's mentions of the topic not yet in the store,
	// included in Count (include=pending).
	Pending int64 `json:"pending,omitempty"`
	// IncludesPending says Count includes Pending.
	IncludesPending bool `json:"includesPending,omitempty"`
}

// Count is a topic's count over a window, in the total's JSON shape with
// the interval covered.
type Count struct {
	Topic string `json:"topic"`
	Count int64  `json:"count"`
	Served
	Shards int `json:"shards"`
	// Saturated says the sum passed the int64 range and is capped.
	Saturated bool `json:"saturated,omitempty"`
	// Window is the window asked for; From and To the interval its
	// buckets cover (RFC 3339), at Resolution (1m or 1h).
	Window     string    `json:"window"`
	From       time.Time `json:"from"`
	To         time.Time `json:"to"`
	Resolution string    `json:"resolution"`
}

// Served says where an answer came from and how old it is.
type Served struct {
	// Source is "cache" or "store".
	Source string `json:"source"`
	// AgeMs is how long ago, in milliseconds, it was read from the store.
	AgeMs int64 `json:"ageMs"`
}

// Point is one step of a series: its start and its count.
type Point struct {
	From  time.Time `json:"from"`
	Count int64     `json:"count"`
}

// Series is a topic's counts step by step over a window, oldest first; the
// last point is the step now falls in, counted up to now.
type Series struct {
	Topic      string    `json:"topic"`
	Window     string    `json:"window"`
	Step       string    `json:"step"`
	Resolution string    `json:"resolution"`
	From       time.Time `json:"from"`
	To         time.Time `json:"to"`
	Served
	Shards int     `json:"shards"`
	Points []Point `json:"points"`
}

// Entry is one trending topic: its count in the window (exact), its
// distinct contributors in it (estimated: see the trend package's Precision), its baseline
// (what the window's buckets, from From to now, would hold at the topic's rate over the baseline
// span, in the ranking's unit: mentions, or contributors per minute) and
// its score.
type Entry struct {
	Topic        string  `json:"topic"`
	Count        int64   `json:"count"`
	Contributors int64   `json:"contributors"`
	Baseline     float64 `json:"baseline"`
	Score        float64 `json:"score"`
}

// Trending is the fleet's trending list for a window, highest score first.
type Trending struct {
	Window string    `json:"window"`
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	// BaselineFrom and BaselineTo are the span the baselines come from
	// (absent while there is none).
	BaselineFrom time.Time `json:"baselineFrom,omitzero"`
	BaselineTo   time.Time `json:"baselineTo,omitzero"`
	Served
	Topics []Entry `json:"topics"`
	// Note says why the list is empty when it is for want of mentions or
	// of history.
	Note string `json:"note,omitempty"`
}
