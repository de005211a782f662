// Package audit recounts the mention stream and compares it with the
// table: `hotcount audit`, for the on-call engineer who asks whether the
// numbers are right.
//
// Run reads the stream's retained history with ordered consumers (no
// durable state: the sidecars' consumer is not touched), judges every
// message as the durable modes' consumer does (ingest.Judge), counts each
// topic's mentions (its total, and its minute and hour buckets by the
// mention's time), then reads those counters from the table and lists the
// ones that differ. What it cannot prove it does not compare, and says so
// (Report.Notes): totals need the whole stream since the table began; a
// bucket needs every mention that could land in it (a mention's "at" may
// be up to --max-lateness before its publication). In the durable modes a
// counter is compared exactly up to the stream position its items record
// (package store, position.go): the mentions at or below its stream's
// checkpoint must be there, and of those past it, published during the
// audit too, the ones at or below that position and no other. A counter
// the sidecars hold out of the table (its writes refused) is left out and
// counted; so, in core mode, where no item records a position, is one
// whose count moves while it is read.
//
// Memory is bounded: Run holds at most Config.MaxCounters counters at
// once. When the stream has more, it reads the stream again for each share
// of the topics (topic hash mod k), comparing one share at a time, so the
// result is the same, exactly, only slower.
package audit

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// Defaults of Config.
const (
	// DefaultMaxCounters bounds the counters (a topic's total, each of its
	// buckets) held at once: about 100 MB at a million.
	DefaultMaxCounters = 1_000_000
	// DefaultRate is the table reads (items) per second.
	DefaultRate = 1000
	// DefaultMaxListed is how many differences a report lists; the rest
	// are counted.
	DefaultMaxListed = 1000
	// DefaultProgressEvery is how often Config.Progress is called.
	DefaultProgressEvery = time.Second
)

// expiryMargin keeps out of the comparison a bucket that expires within
// it: its item may be read as gone (store.DynamoDB.Counts reads an expired
// item as 0) between the moment the audit plans the read and the read.
const expiryMargin = time.Minute

// idle is how long a stream read waits for a message before it asks the
// server whether any is left.
const idle = 2 * time.Second

// Table is what the audit reads of the table. store.DynamoDB is one (and
// store.Bolt). Implementations must be safe for use by one goroutine; the
// audit calls one method at a time and owns the maps returned.
type Table interface {
	// GatherMany reads shards 0..n-1 of each topic's total, and more
	// where its metadata says it has more (schema.Meta.Read): one entry
	// per shard, zeros for shards never written.
	GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error)
	// Counts reads the count of each item in keys (schema.BucketKey's); a
	// missing item, or one past its expiry, counts 0.
	Counts(ctx context.Context, keys []string, consistent bool) (map[string]int64, error)
	// Records reads the items keys name (in every Region), strongly
	// consistent, each with its count and the stream positions it
	// records, read together: a missing or expired item is not listed.
	Records(ctx context.Context, keys []string) (map[string][]store.Record, error)
}

// Stream is one stream the audit reads.
type Stream struct {
	// Name is the stream's name.
	Name string
	// Partitioned says the stream is a partition stream (partitioned
	// mode), whose subjects carry the partition first
	// (streams.Unstored): every message is judged, as the sidecars'
	// unfiltered consumer judges it. Otherwise the stream is jetstream
	// (or core) mode's, whose sidecars' consumer takes only subjects
	// under the prefix: other messages are skipped, not rejected.
	Partitioned bool
	// Durable says the durable sidecars read it (jetstream and
	// partitioned modes): its checkpoint (Config.Checkpoints) tells which
	// mentions may not be in the table yet. In core mode nothing tells.
	Durable bool
	// Rules is the stream's rules history (package rules): each message
	// is judged by the rules in force at its sequence, as the sidecars
	// judge it. Empty: by Config's Limits and windows.
	Rules rules.History
}

// Checkpoints are the durable sidecars' checkpoint records (package
// durable): for the stream named, as it was created, the sequence at and
// below which every mention is in the table, and the counters held out
// of the table (the store refused their writes) with mentions at or
// below it. A stream created again after its record was written has no
// checkpoint yet: 0.
type Checkpoints interface {
	Checkpoint(ctx context.Context, stream string, created time.Time) (seq uint64, held []schema.Counter, err error)
}

// Config is what an audit reads and how.
type Config struct {
	// Streams are the streams of mentions: one in core and jetstream
	// modes, every partition stream in partitioned mode. Required.
	Streams []Stream
	// Checkpoints reads the checkpoints of the Durable streams; required
	// when one is.
	Checkpoints Checkpoints
	// Prefix is the topic prefix of the subject ("mentions.":
	// mention.Prefix of --subject). Required.
	Prefix string
	// Limits are the sidecars' (--max-count, --max-topic-bytes and
	// --max-lateness as config.Lateness gives it): a message is judged
	// with them.
	Limits mention.Limits
	// Minutes and Hours are the buckets the sidecars write (--windows);
	// neither: totals only.
	Minutes, Hours bool
	// Retention is the buckets' (--minute-retention, --hour-retention): a
	// bucket past its expiry is not compared.
	Retention schema.Retention
	// Shards is the shards read of a topic without metadata (--shards),
	// as the lookup API reads them.
	Shards int
	// Since and Until bound the mentions read by their stream timestamps;
	// zero: the stream's start, its end. Totals are compared only when
	// neither cuts the stream. With Until, the stream is read up to
	// Until + Limits.MaxLateness (or its end), so that a late mention
	// reaches its bucket, and the buckets that end by Until are compared.
	Since, Until time.Time
	// MaxCounters bounds the counters held at once (0:
	// DefaultMaxCounters); one topic's own are held whole however many.
	MaxCounters int
	// Rate is the table reads (items) a second; 0: DefaultRate, negative:
	// no limit. Reads are strongly consistent.
	Rate float64
	// MaxListed is how many differences the report lists (0:
	// DefaultMaxListed); the rest are counted.
	MaxListed int
	// Progress, when set, is called every ProgressEvery (0:
	// DefaultProgressEvery) while the stream is read, on Run's goroutine.
	Progress      func(Progress)
	ProgressEvery time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Progress is how far an audit is.
type Progress struct {
	// Pass is the stream read under way, from 1; Shares how many shares
	// of the topics are known so far (1 unless the counters outgrew
	// MaxCounters).
	Pass, Shares int
	// Read is the messages read in this pass, of about Total.
	Read, Total int64
}

// Report is an audit's outcome.
type Report struct {
	// Streams are the streams read, as they were when the audit began.
	Streams []StreamReport `json:"streams"`
	// Since and Until are Config's (nil: not set).
	Since *time.Time `json:"since,omitempty"`
	Until *time.Time `json:"until,omitempty"`
	// Messages are the messages read (the first complete pass's);
	// Mentions the mentions of those taken; Rejected those the sidecars
	// reject, by reason (mention.Reason*), and not counted; Probes those
	// marked streams.ProbeHeader and Outside those outside --subject
	// (jetstream mode), skipped as the sidecars skip them.
	Messages int64            `json:"messages"`
	Mentions int64            `json:"mentions"`
	Topics   int64            `json:"topics"`
	Rejected map[string]int64 `json:"rejected"`
	Probes   int64            `json:"probes"`
	Outside  int64            `json:"outside"`
	// Passes are the stream reads made; Shares the shares of the topics
	// compared (1 unless the counters outgrew MaxCounters).
	Passes int `json:"passes"`
	Shares int `json:"shares"`
	// Totals and Buckets say what was compared.
	Totals  Check `json:"totals"`
	Buckets Check `json:"buckets"`
	// InFlight are the counters not compared because some of their
	// mentions were in flight where no position tells which the table
	// includes: in core mode, published during the audit or changing in
	// the table while it was read; in the durable modes, a counter whose
	// items record one stream's position twice. Held are those not compared because the
	// sidecars hold their mentions out of the table (the store refuses
	// their writes: `hotcount quarantine list`).
	InFlight int64 `json:"inFlight"`
	Held     int64 `json:"held,omitempty"`
	// Foreign are those that differ from the streams read and whose items
	// hold mentions of a stream, or a creation of one, that the audit does
	// not read (a stream deleted and created again, another Region's): not
	// proved either way.
	Foreign int64 `json:"foreign,omitempty"`
	// Notes say, in sentences, what was not checked and why.
	Notes []string `json:"notes"`
	// Differences are the counters that differ (at most MaxListed), by
	// topic; Unlisted those left out of the list.
	Differences []Difference `json:"differences"`
	Unlisted    int64        `json:"unlisted"`
}

// StreamReport is one stream as the audit found it.
type StreamReport struct {
	Name     string    `json:"name"`
	FirstSeq uint64    `json:"firstSeq"`
	LastSeq  uint64    `json:"lastSeq"`
	Messages uint64    `json:"messages"`
	Created  time.Time `json:"created"`
	// Whole says no mention of it can have been removed by its limits
	// (younger than its max age, no limit that discards old messages).
	Whole bool `json:"whole"`
}

// Check is what was compared of one kind of counter.
type Check struct {
	// Checked says whether any was compared.
	Checked bool `json:"checked"`
	// Compared and Differ count the counters compared and those that
	// differ.
	Compared int64 `json:"compared"`
	Differ   int64 `json:"differ"`
	// Buckets only: Partial are those skipped because they lie partly
	// outside what was read (a mention that could land in them was not
	// read), Expired those past their retention (or within a minute of
	// it).
	Partial int64 `json:"partial,omitempty"`
	Expired int64 `json:"expired,omitempty"`
}

// Difference is one counter whose count in the table is not the
// stream's.
type Difference struct {
	Topic string `json:"topic"`
	// Counter is "total", "minute" or "hour".
	Counter string `json:"counter"`
	// Bucket is the bucket's start (a minute or an hour), for a bucket.
	Bucket *time.Time `json:"bucket,omitempty"`
	// Stream is the stream's count, Table the table's, Difference
	// Table − Stream.
	Stream     int64 `json:"stream"`
	Table      int64 `json:"table"`
	Difference int64 `json:"difference"`
}

// Differ is how many counters differ.
func (r Report) Differ() int64 { return r.Totals.Differ + r.Buckets.Differ }

// ErrDiffers is returned by callers (hotcount audit) whose report found
// counters that differ.
var ErrDiffers = errors.New("audit: the table differs from the stream")

// validate checks cfg and fills its defaults.
func (cfg *Config) validate() error {
	switch {
	case len(cfg.Streams) == 0:
		return errors.New("audit: no stream to read")
	case cfg.Prefix == "" || !strings.HasSuffix(cfg.Prefix, "."):
		return fmt.Errorf("audit: prefix %q must end with a dot", cfg.Prefix)
	case !cfg.Since.IsZero() && !cfg.Until.IsZero() && !cfg.Until.After(cfg.Since):
		return fmt.Errorf("audit: until %s is not after since %s", cfg.Until.Format(time.RFC3339), cfg.Since.Format(time.RFC3339))
	case cfg.MaxCounters < 0:
		return fmt.Errorf("audit: max counters %d is negative", cfg.MaxCounters)
	case cfg.Checkpoints == nil && slices.ContainsFunc(cfg.Streams, func(s Stream) bool { return s.Durable }):
		return errors.New("audit: a durable stream and no checkpoints to read")
	}
	if cfg.MaxCounters == 0 {
		cfg.MaxCounters = DefaultMaxCounters
	}
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.MaxListed <= 0 {
		cfg.MaxListed = DefaultMaxListed
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = DefaultProgressEvery
	}
	if cfg.Limits.MaxLateness <= 0 {
		cfg.Limits.MaxLateness = mention.DefaultMaxLateness
	}
	if cfg.Limits.MaxCount <= 0 {
		cfg.Limits.MaxCount = mention.DefaultMaxCount
	}
	if cfg.Limits.MaxTopicBytes <= 0 {
		cfg.Limits.MaxTopicBytes = mention.DefaultMaxTopicBytes
	}
	cfg.Shards = max(cfg.Shards, 1)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return nil
}

// Run audits the streams of cfg against table: see the package doc. An
// error means the audit could not finish (a stream missing, NATS or the
// table failing, ctx ended); counters that differ are in the report, not
// an error.
func Run(ctx context.Context, js jetstream.JetStream, table Table, cfg Config) (Report, error) {
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	a := &auditor{js: js, table: table, cfg: cfg, limiter: newLimiter(cfg.Rate)}
	return a.run(ctx)
}

// share is the topics whose hash is rem modulo mod.
type share struct{ mod, rem uint64 }

func (s share) has(topic string) bool {
	if s.mod <= 1 {
		return true
	}
	h := fnv.New64a()
	h.Write([]byte(topic)) //nolint:errcheck // a hash.Hash never fails
	return h.Sum64()%s.mod == s.rem
}

// split divides s into n shares.
func (s share) split(n uint64) []share {
	mod := max(s.mod, 1)
	out := make([]share, n)
	for i := range n {
		out[i] = share{mod: mod * n, rem: s.rem + i*mod}
	}
	return out
}

// auditor is one Run.
type auditor struct {
	js      jetstream.JetStream
	table   Table
	cfg     Config
	limiter *limiter

	start   time.Time // when the audit began
	streams []snapshot
	report  Report
	passes  int
	stats   bool // the report's stream figures are set (a pass completed)
}

// snapshot is one stream as the audit began: it reads up to last.
type snapshot struct {
	Stream
	info *jetstream.StreamInfo
	last uint64
}

func (a *auditor) run(ctx context.Context) (Report, error) {
	a.start = a.cfg.Now()
	r := &a.report
	r.Rejected = map[string]int64{}
	r.Notes = []string{}
	r.Differences = []Difference{}
	if !a.cfg.Since.IsZero() {
		r.Since = &a.cfg.Since
	}
	if !a.cfg.Until.IsZero() {
		r.Until = &a.cfg.Until
	}
	for _, st := range a.cfg.Streams {
		s, err := a.js.Stream(ctx, st.Name)
		if err != nil {
			return Report{}, fmt.Errorf("audit: stream %s: %w", st.Name, err)
		}
		info := s.CachedInfo()
		a.streams = append(a.streams, snapshot{Stream: st, info: info, last: info.State.LastSeq})
		r.Streams = append(r.Streams, StreamReport{
			Name: st.Name, FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq,
			Messages: info.State.Msgs, Created: info.Created.UTC(), Whole: whole(info, a.start),
		})
	}
	if !a.cfg.Until.IsZero() && !a.cfg.Until.Before(a.start) {
		a.note("--until %s is not before the audit's start: the whole stream is read", stamp(a.cfg.Until))
		a.cfg.Until = time.Time{}
		r.Until = nil
	}
	queue := []share{{mod: 1}}
	for len(queue) > 0 {
		sh := queue[0]
		p, err := a.read(ctx, sh, len(queue)+r.Shares)
		if err != nil {
			return Report{}, err
		}
		if p.overflow > 0 {
			queue = append(sh.split(p.overflow), queue[1:]...)
			continue
		}
		queue = queue[1:]
		if err := a.compare(ctx, p); err != nil {
			return Report{}, err
		}
		r.Shares++
	}
	r.Passes = a.passes
	a.summarize()
	return *r, nil
}

// note adds a sentence to the report's notes, once.
func (a *auditor) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	if !slices.Contains(a.report.Notes, n) {
		a.report.Notes = append(a.report.Notes, n)
	}
}

// summarize sorts the differences and says what was checked.
func (a *auditor) summarize() {
	r := &a.report
	slices.SortFunc(r.Differences, func(x, y Difference) int {
		if c := strings.Compare(x.Topic, y.Topic); c != 0 {
			return c
		}
		if c := strings.Compare(counterOrder(x.Counter), counterOrder(y.Counter)); c != 0 {
			return c
		}
		switch {
		case x.Bucket == nil || y.Bucket == nil:
			return 0
		default:
			return x.Bucket.Compare(*y.Bucket)
		}
	})
	if !a.cfg.Minutes && !a.cfg.Hours {
		a.note("buckets not checked: --windows is none (the sidecars write totals only)")
	}
	if r.Buckets.Partial > 0 {
		a.note("%d buckets not checked: partly outside what the stream holds or what was read (a mention's \"at\" may be up to --max-lateness %s before its publication, or %s after)",
			r.Buckets.Partial, a.cfg.Limits.MaxLateness, mention.MaxAhead)
	}
	if r.Buckets.Expired > 0 {
		a.note("%d buckets not checked: past their retention (--minute-retention %s, --hour-retention %s), or within a minute of it",
			r.Buckets.Expired, a.cfg.Retention.Of(schema.Minute), a.cfg.Retention.Of(schema.Hour))
	}
	if r.InFlight > 0 {
		a.note("%d counters not checked: mentions of them were in flight where no item records a position (core mode: published during the audit, or written while it read them; or one stream's position recorded in two items); run the audit again once the sidecars have caught up", r.InFlight)
	}
	a.note("counters of topics the stream does not mention, and buckets in which it has none, are not read (that would take a scan of the table)")
	if r.Unlisted > 0 {
		a.note("%d more differences not listed (--max-listed %d)", r.Unlisted, a.cfg.MaxListed)
	}
}

func counterOrder(c string) string {
	switch c {
	case "total":
		return "0"
	case "hour":
		return "1"
	}
	return "2"
}

// whole says whether no message of the stream info describes can have
// been removed by its limits as of now: it is younger than its max age
// (with a minute's margin for clocks), keeps its messages by limits, and
// no limit discards old ones. Deleted messages (the probes `hotcount
// stream create` deletes, or by hand) it cannot see.
func whole(info *jetstream.StreamInfo, now time.Time) bool {
	c := info.Config
	if c.Retention != jetstream.LimitsPolicy {
		return false
	}
	if c.MaxAge > 0 && !info.Created.After(now.Add(-c.MaxAge+time.Minute)) {
		return false
	}
	if c.Discard == jetstream.DiscardOld && (c.MaxMsgs > 0 || c.MaxBytes > 0) {
		return false
	}
	if c.MaxMsgsPerSubject > 0 && !(c.Discard == jetstream.DiscardNew && c.DiscardNewPerSubject) {
		return false
	}
	return true
}

// stamp formats t for a note.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
