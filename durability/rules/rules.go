// Package rules is what decides a count, recorded with the stream that
// holds the mentions: which mode reads it, which items its counters live
// in, and how each message is judged. Exactly once by stream position
// needs every reader of a sequence to write the same items and to judge
// the message alike; a fleet is never one configuration for long (a
// rolling deploy runs two sets of settings side by side, a table becomes
// global, a mode is switched), so no reader judges by its own flags. Every
// reader judges the message at a sequence by the rules in force at that
// sequence, read from the stream.
//
// Where the rules live. Each change is a message in the stream itself, on
// a subject of its own (Subject), so that every reader meets it in order,
// at the same sequence, however far behind or ahead it reads. It is
// published by compare-and-set on that subject (the server's expected
// last subject sequence), so two sidecars recording a stream's first
// rules, or two operators changing them, cannot both win. A copy of the
// whole history is kept in the checkpoint bucket (Book), because a
// stream's limits age the messages out: a reader that starts after the
// last change still finds the rules in force. The stream is the order and
// the copy the memory; neither alone rolls back silently: a history that
// names a change the stream no longer has at its sequence (a stream
// restored from a backup) is refused (ErrRolledBack).
package rules

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hotcount/hotcount/mention"
)

// The modes that read a stream.
const (
	ModeJetStream   = "jetstream"
	ModePartitioned = "partitioned"
)

// Rules are what decide a count: whether a message counts, how much, in
// which counters and in which items.
type Rules struct {
	// Structure: which streams and items. A reader whose settings differ
	// here would read other streams or write other items, so it refuses
	// (Differences' Structural).
	Mode       string `json:"mode"`
	Subject    string `json:"subject"`
	Partitions int    `json:"partitions,omitempty"`
	// Table is the DynamoDB table, or "embedded" for the embedded store.
	Table string `json:"table"`
	// Region is the Region layout: "" the single-Region layout, else the
	// Region whose own shards are written (TREND#<topic>#<region>.<n>).
	Region string `json:"region,omitempty"`

	// Judgement: how each message counts. A reader whose settings differ
	// follows the stream (the retentions excepted: they are the
	// buckets' lifetime, which the store sets from its own settings).
	MaxCount      int64    `json:"maxCount"`
	MaxTopicBytes int      `json:"maxTopicBytes"`
	MaxLateness   Duration `json:"maxLateness"`
	// Minutes and Hours are --windows' 1m and 1h: whether a mention also
	// counts in its minute's and its hour's bucket.
	Minutes bool `json:"minutes,omitempty"`
	Hours   bool `json:"hours,omitempty"`
	// MinuteRetention and HourRetention are how long the buckets are kept
	// (their items' expiresAt).
	MinuteRetention Duration `json:"minuteRetention"`
	HourRetention   Duration `json:"hourRetention"`
}

// Limits are the ingest's checks of a message under r.
func (r Rules) Limits() mention.Limits {
	return mention.Limits{MaxCount: r.MaxCount, MaxTopicBytes: r.MaxTopicBytes, MaxLateness: time.Duration(r.MaxLateness)}
}

// Windows is r's windows as --windows takes them ("1m,1h", "" for none).
func (r Rules) Windows() string {
	var w []string
	if r.Minutes {
		w = append(w, "1m")
	}
	if r.Hours {
		w = append(w, "1h")
	}
	return strings.Join(w, ",")
}

// Duration is a time.Duration that JSON shows as "24h0m0s".
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes d as time.Duration's String.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// A Difference is one setting in which a sidecar's flags and a stream's
// rules differ.
type Difference struct {
	// Setting is the flag: "max-count".
	Setting string
	// Stream and Own are the stream's value and the sidecar's.
	Stream, Own string
	// Structural says the sidecar cannot follow the stream's value: it
	// would read other streams or write other items.
	Structural bool
}

func (d Difference) String() string {
	return fmt.Sprintf("--%s: the stream's rules say %q, this sidecar's settings %q", d.Setting, d.Stream, d.Own)
}

// Differences are the settings in which own differs from the stream's
// rules, structural ones first.
func Differences(stream, own Rules) []Difference {
	var out []Difference
	cmp := func(setting string, a, b any, structural bool) {
		if s, o := fmt.Sprint(a), fmt.Sprint(b); s != o {
			out = append(out, Difference{Setting: setting, Stream: s, Own: o, Structural: structural})
		}
	}
	cmp("nats-mode", stream.Mode, own.Mode, true)
	cmp("subject", stream.Subject, own.Subject, true)
	cmp("partitions", stream.Partitions, own.Partitions, true)
	cmp("table", stream.Table, own.Table, true)
	cmp("region", stream.Region, own.Region, true)
	cmp("max-count", stream.MaxCount, own.MaxCount, false)
	cmp("max-topic-bytes", stream.MaxTopicBytes, own.MaxTopicBytes, false)
	cmp("max-lateness", stream.MaxLateness, own.MaxLateness, false)
	cmp("windows", stream.Windows(), own.Windows(), false)
	// The retentions set the buckets' expiresAt, which the store writes
	// from its own settings.
	cmp("minute-retention", stream.MinuteRetention, own.MinuteRetention, true)
	cmp("hour-retention", stream.HourRetention, own.HourRetention, true)
	return out
}

// Structural are the differences among ds that a sidecar cannot follow.
func Structural(ds []Difference) []Difference {
	return slices.DeleteFunc(slices.Clone(ds), func(d Difference) bool { return !d.Structural })
}

// A Change is one record of a stream's rules: in force from the message
// after Seq of the stream's creation Epoch on.
type Change struct {
	// Epoch is the stream's creation (store.EpochOf) and Seq the rules
	// message's sequence in it.
	Epoch int64  `json:"epoch"`
	Seq   uint64 `json:"seq"`
	// At, By and Why say when, who and why: the audit trail `hotcount
	// stream status` shows.
	At    time.Time `json:"at"`
	By    string    `json:"by"`
	Why   string    `json:"why"`
	Rules Rules     `json:"rules"`
}

// message is a Change as its stream message carries it: the stream gives
// its epoch and sequence.
type message struct {
	At    time.Time `json:"at"`
	By    string    `json:"by"`
	Why   string    `json:"why"`
	Rules Rules     `json:"rules"`
}

// Parse reads the rules message at seq of the stream's creation epoch.
func Parse(data []byte, epoch int64, seq uint64) (Change, error) {
	var m message
	if err := json.Unmarshal(data, &m); err != nil {
		return Change{}, fmt.Errorf("rules: message %d: %w", seq, err)
	}
	return Change{Epoch: epoch, Seq: seq, At: m.At, By: m.By, Why: m.Why, Rules: m.Rules}, nil
}

func (c Change) body() ([]byte, error) {
	return json.Marshal(message{At: c.At, By: c.By, Why: c.Why, Rules: c.Rules})
}

// History is a stream's changes, in the order of its creations and
// sequences.
type History []Change

// In is the rules in force for the message at seq of creation epoch: the
// last change of that creation before it, or its first change for the
// messages stored before the first was recorded. ok is false when the
// creation has none.
func (h History) In(epoch int64, seq uint64) (r Rules, ok bool) {
	for _, c := range h {
		if c.Epoch != epoch {
			continue
		}
		if !ok || c.Seq < seq {
			r, ok = c.Rules, true
		}
	}
	return r, ok
}

// Latest is the last change of all, in any creation.
func (h History) Latest() (Change, bool) {
	if len(h) == 0 {
		return Change{}, false
	}
	return h[len(h)-1], true
}

// latestOf is the last change of creation epoch.
func (h History) latestOf(epoch int64) (Change, bool) {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Epoch == epoch {
			return h[i], true
		}
	}
	return Change{}, false
}

// With is h with c in its place, unless h has it.
func (h History) With(c Change) History {
	i, found := slices.BinarySearchFunc(h, c, func(a, b Change) int {
		if a.Epoch != b.Epoch {
			return cmpInt(a.Epoch, b.Epoch)
		}
		return cmpInt(a.Seq, b.Seq)
	})
	if found {
		return h
	}
	return slices.Insert(slices.Clone(h), i, c)
}

func cmpInt[T int64 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
