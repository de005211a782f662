package audit

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// maxBatch is DynamoDB's most keys in one BatchGetItem call.
const maxBatch = 100

// limiter paces table reads: batch is the most keys one call reads, and
// no more than the limit's burst.
type limiter struct {
	l     *rate.Limiter
	batch int
}

// newLimiter paces reads at perSecond items (negative: no limit).
func newLimiter(perSecond float64) *limiter {
	if perSecond < 0 {
		return &limiter{l: rate.NewLimiter(rate.Inf, maxBatch), batch: maxBatch}
	}
	b := int(min(max(perSecond, 1), maxBatch))
	return &limiter{l: rate.NewLimiter(rate.Limit(perSecond), b), batch: b}
}

// wait waits until n more reads are allowed.
func (l *limiter) wait(ctx context.Context, n int) error {
	for n > 0 {
		k := min(n, l.batch)
		if err := l.l.WaitN(ctx, k); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		n -= k
	}
	return nil
}

// compare reads from the table the counters of p that can be proved and
// adds what it finds to the report.
func (a *auditor) compare(ctx context.Context, p *pass) error {
	a.takeStats(p)
	a.report.Topics += int64(len(p.topics))
	// The counters held now, besides those held as the pass began: a
	// write refused since is held too.
	_, held, err := a.floors(ctx)
	if err != nil {
		return err
	}
	for c := range p.held {
		held[c] = true
	}
	cs := a.comparable(p, held)
	if len(cs) == 0 {
		return nil
	}
	got, shards, err := a.readTable(ctx, cs, nil)
	if err != nil {
		return err
	}
	want := make(map[schema.Counter]int64, len(cs))
	var differ []schema.Counter
	for _, c := range cs {
		want[c] = p.counts[c].all()
		if got[c] != want[c] {
			differ = append(differ, c)
		}
	}
	differ, flown, err := a.settle(ctx, p, differ, want, got, shards)
	if err != nil {
		return err
	}
	a.record(cs, differ, flown, want, got)
	return nil
}

// takeStats keeps the first complete pass's figures: every pass reads the
// same messages, so the first says what they were.
func (a *auditor) takeStats(p *pass) {
	if a.stats {
		return
	}
	r := &a.report
	a.stats = true
	r.Messages, r.Mentions, r.Probes, r.Outside = p.messages, p.mentions, p.probes, p.outside
	for k, v := range p.rejected {
		r.Rejected[k] = v
	}
	for _, w := range p.why {
		a.note("%s", w)
	}
	r.Totals.Checked = p.totals && len(p.unread) == 0
	r.Buckets.Checked = a.cfg.Minutes || a.cfg.Hours
}

// comparable is the pass's counters the table can be held to: totals only
// when the pass read the whole history, buckets the pass read whole and
// not expired, and none the sidecars hold. What it leaves out is counted
// in the report.
func (a *auditor) comparable(p *pass, held map[schema.Counter]bool) []schema.Counter {
	r := &a.report
	totals := p.totals && len(p.unread) == 0
	now := a.cfg.Now()
	var want []schema.Counter
	for c := range p.counts {
		if c.Kind == schema.Total && !totals {
			continue
		}
		if g, ok := c.Granularity(); ok {
			if p.partial(a, g, c.Index) {
				r.Buckets.Partial++
				continue
			}
			if !g.Start(c.Index + 1).Add(a.cfg.Retention.Of(g)).After(now.Add(expiryMargin)) {
				r.Buckets.Expired++
				continue
			}
		}
		if held[c] {
			r.Held++
			continue
		}
		want = append(want, c)
	}
	return want
}

// settle judges again the counters that differ from the whole stream as
// read: some of their mentions may not be in the table yet, and mentions
// published since the audit began may be. Each counter's items are read
// with the positions they record, and the counter is held to exactly the
// mentions up to those positions, those published since included
// (growth): equal, it was only in flight; else it differs, and want and
// got say by how much. Where nothing records a position (core mode), a
// counter the new mentions touch, or whose count moved since got, is in
// flight (flown), not judged; so is one whose items record the same
// stream twice (a layout the audit cannot cut at one position).
func (a *auditor) settle(ctx context.Context, p *pass, differ []schema.Counter, want, got map[schema.Counter]int64, shards map[string]int) (kept []schema.Counter, flown map[schema.Counter]bool, err error) {
	flown = make(map[schema.Counter]bool)
	if len(differ) == 0 {
		return nil, flown, nil
	}
	// The items first, then the stream up to the furthest position they
	// record: a write landing after a growth scan would record mentions
	// the scan never read.
	items, err := a.readRecords(ctx, differ, shards)
	if err != nil {
		return nil, nil, err
	}
	ends := make([]uint64, len(a.streams))
	for _, it := range items {
		for i, seq := range it.seq {
			ends[i] = max(ends[i], seq)
		}
	}
	grown, moved, err := a.growth(ctx, p.share, differ, ends)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range differ {
		it, cl := items[c], p.counts[c]
		if it.foreign != nil {
			a.report.Foreign++
			a.note("counters not checked (foreign): their items hold mentions of a stream the audit does not read, e.g. %s created at %s (deleted and created again since, or another Region's)",
				it.foreign.Stream, stamp(time.UnixMicro(it.foreign.Epoch)))
			flown[c] = true
			continue
		}
		if moved[c] || it.twice || cl.core && it.count != got[c] {
			a.report.InFlight++
			flown[c] = true
			continue
		}
		whole := *cl
		whole.tail = append(slices.Clip(cl.tail), grown[c]...)
		want[c], got[c] = whole.upTo(it.seq), it.count
		if want[c] != got[c] {
			kept = append(kept, c)
		}
	}
	return kept, flown, nil
}

// record counts what was compared and lists what differs.
func (a *auditor) record(cs, differ []schema.Counter, flown map[schema.Counter]bool, want, got map[schema.Counter]int64) {
	r := &a.report
	for _, c := range cs {
		if flown[c] {
			continue
		}
		if c.Kind == schema.Total {
			r.Totals.Compared++
		} else {
			r.Buckets.Compared++
		}
	}
	for _, c := range differ {
		d := Difference{Topic: c.Topic, Counter: "total", Stream: want[c], Table: got[c], Difference: got[c] - want[c]}
		if c.Kind == schema.Total {
			r.Totals.Differ++
		} else {
			r.Buckets.Differ++
			g, _ := c.Granularity()
			start := g.Start(c.Index)
			d.Counter, d.Bucket = "minute", &start
			if g == schema.Hour {
				d.Counter = "hour"
			}
		}
		if len(r.Differences) < a.cfg.MaxListed {
			r.Differences = append(r.Differences, d)
		} else {
			r.Unlisted++
		}
	}
}

// partial says whether bucket i of g may hold mentions the pass did not
// read: a mention stored at t is counted at its "at", from t −
// max-lateness to t + MaxAhead.
func (p *pass) partial(a *auditor, g schema.Granularity, i int64) bool {
	start, end := g.Start(i), g.Start(i+1)
	for _, s := range p.unread {
		if s.from.Add(-a.cfg.Limits.MaxLateness).Before(end) && !s.to.Add(mention.MaxAhead).Before(start) {
			return true
		}
	}
	return false
}

// floors are, per stream, the last sequence up to which every mention is
// in the table (all of them where nothing tells: core mode), and the
// counters the sidecars hold out of it.
func (a *auditor) floors(ctx context.Context) ([]uint64, map[schema.Counter]bool, error) {
	out := make([]uint64, len(a.streams))
	held := make(map[schema.Counter]bool)
	for i, s := range a.streams {
		out[i] = math.MaxUint64
		if !s.Durable {
			a.note("core mode: the sidecars do not consume the stream, so mentions still in their buffers cannot be told apart: a count of the last flush interval may differ")
			continue
		}
		seq, hs, err := a.cfg.Checkpoints.Checkpoint(ctx, s.Name, s.info.Created)
		if err != nil {
			return nil, nil, fmt.Errorf("audit: checkpoint of stream %s: %w", s.Name, err)
		}
		out[i] = seq
		for _, c := range hs {
			held[c] = true
		}
	}
	return out, held, nil
}

// readTable reads counters from the table, strongly consistent, paced:
// totals by GatherMany, buckets by Counts over their topic's shards.
// shards, when given, are each topic's shards as read before (else the
// totals' gather reads them, for the topics of the buckets too). It
// returns each counter's count and the shards of each topic.
func (a *auditor) readTable(ctx context.Context, cs []schema.Counter, shards map[string]int) (map[schema.Counter]int64, map[string]int, error) {
	out := make(map[schema.Counter]int64, len(cs))
	if shards == nil {
		shards = make(map[string]int)
	}
	var gather []string
	seen := make(map[string]bool)
	for _, c := range cs {
		_, known := shards[c.Topic]
		if !seen[c.Topic] && (c.Kind == schema.Total || !known) {
			seen[c.Topic] = true
			gather = append(gather, c.Topic)
		}
	}
	slices.Sort(gather)
	per := a.cfg.Shards + 1 // shards and the metadata item
	step := max(1, a.limiter.batch/per)
	for i := 0; i < len(gather); i += step {
		chunk := gather[i:min(i+step, len(gather))]
		if err := a.limiter.wait(ctx, len(chunk)*per); err != nil {
			return nil, nil, err
		}
		m, err := a.table.GatherMany(ctx, chunk, a.cfg.Shards, true)
		if err != nil {
			return nil, nil, fmt.Errorf("audit: read totals: %w", err)
		}
		extra := 0
		for t, sh := range m {
			shards[t] = len(sh)
			extra += max(0, len(sh)-a.cfg.Shards)
			out[schema.TotalOf(t)], _ = schema.Sum(sh)
		}
		if err := a.limiter.wait(ctx, extra); err != nil {
			return nil, nil, err
		}
	}
	var keys []string
	for _, c := range cs {
		if c.Kind == schema.Total {
			continue
		}
		for s := range max(shards[c.Topic], 1) {
			keys = append(keys, c.Key(s))
		}
	}
	counts := make(map[string]int64, len(keys))
	for i := 0; i < len(keys); i += a.limiter.batch {
		chunk := keys[i:min(i+a.limiter.batch, len(keys))]
		if err := a.limiter.wait(ctx, len(chunk)); err != nil {
			return nil, nil, err
		}
		m, err := a.table.Counts(ctx, chunk, true)
		if err != nil {
			return nil, nil, fmt.Errorf("audit: read buckets: %w", err)
		}
		for k, v := range m {
			counts[k] = v
		}
	}
	for _, c := range cs {
		if c.Kind == schema.Total {
			continue
		}
		var sum int64
		for s := range max(shards[c.Topic], 1) {
			sum, _ = schema.SatAdd(sum, counts[c.Key(s)])
		}
		out[c] = sum
	}
	return out, shards, nil
}

// held is what a counter's items hold, read together: their count, and
// each audited stream's position in them (by index in Config.Streams; 0:
// none).
type held struct {
	count int64
	seq   []uint64
	// twice says a stream's position is in more than one of them: no one
	// position tells which mentions they include.
	twice bool
	// foreign is a position they record of a stream, or a creation of
	// one, that the audit does not read (deleted and created again since,
	// another Region's): their count holds mentions it cannot see.
	foreign *store.Slot
}

// readRecords reads the items of each counter of cs (its shards, as
// shards says, in every Region), strongly consistent, paced.
func (a *auditor) readRecords(ctx context.Context, cs []schema.Counter, shards map[string]int) (map[schema.Counter]held, error) {
	keysOf := func(c schema.Counter) []string {
		out := make([]string, max(shards[c.Topic], 1))
		for s := range out {
			out[s] = c.Key(s)
		}
		return out
	}
	var keys []string
	for _, c := range cs {
		keys = append(keys, keysOf(c)...)
	}
	recs := make(map[string][]store.Record, len(keys))
	for i := 0; i < len(keys); i += a.limiter.batch {
		chunk := keys[i:min(i+a.limiter.batch, len(keys))]
		if err := a.limiter.wait(ctx, len(chunk)); err != nil {
			return nil, err
		}
		m, err := a.table.Records(ctx, chunk)
		if err != nil {
			return nil, fmt.Errorf("audit: read items: %w", err)
		}
		maps.Copy(recs, m)
	}
	slots := make([]store.Slot, len(a.streams))
	for i, s := range a.streams {
		slots[i] = store.Slot{Stream: s.Name, Epoch: store.EpochOf(s.info.Created)}
	}
	out := make(map[schema.Counter]held, len(cs))
	for _, c := range cs {
		h := held{seq: make([]uint64, len(slots))}
		found := make([]bool, len(slots))
		for _, k := range keysOf(c) {
			for _, r := range recs[k] {
				h.count, _ = schema.SatAdd(h.count, r.Count)
				for sl, seq := range r.Positions {
					i := slices.Index(slots, sl)
					if i < 0 {
						h.foreign = &sl
						continue
					}
					h.twice = h.twice || found[i]
					found[i], h.seq[i] = true, seq
				}
			}
		}
		out[c] = h
	}
	return out, nil
}

// growth reads what the streams took since the audit began, for the
// counters of cs (of share sh): the mentions of durable streams one by
// one (grown), and which counters a core stream's mentions touch (moved).
func (a *auditor) growth(ctx context.Context, sh share, cs []schema.Counter, ends []uint64) (grown map[schema.Counter][]pastMention, moved map[schema.Counter]bool, err error) {
	want := make(map[schema.Counter]bool, len(cs))
	for _, c := range cs {
		want[c] = true
	}
	grown, moved = make(map[schema.Counter][]pastMention), make(map[schema.Counter]bool)
	for i, s := range a.streams {
		st, err := a.js.Stream(ctx, s.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("audit: stream %s: %w", s.Name, err)
		}
		last := st.CachedInfo().State.LastSeq
		if s.Durable {
			last = ends[i] // what the items include; the rest they are not held to
		}
		if last <= s.last {
			continue
		}
		_, err = a.scan(ctx, s.Name, s.last+1, time.Time{}, last, time.Time{}, func(m message) bool {
			subject := m.subject
			if s.Partitioned {
				subject = streams.Unstored(subject)
			}
			if m.probe {
				return true
			}
			topic, delta, at, err := ingest.Judge(a.cfg.Prefix, subject, m.data, m.ts, a.cfg.Limits)
			if err != nil || !sh.has(topic) {
				return true
			}
			// Every counter the sidecars write for it, whatever the
			// audit compares.
			for _, c := range []schema.Counter{schema.TotalOf(topic), schema.BucketOf(topic, schema.Minute, schema.Minute.Index(at)), schema.BucketOf(topic, schema.Hour, schema.Hour.Index(at))} {
				switch {
				case !want[c]:
				case s.Durable:
					grown[c] = append(grown[c], pastMention{stream: i, seq: m.seq, delta: delta})
				default:
					moved[c] = true
				}
			}
			return true
		})
		if err != nil {
			return nil, nil, err
		}
	}
	return grown, moved, nil
}
