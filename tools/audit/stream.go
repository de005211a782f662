package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// readBatch is how many messages one pull of a stream read asks for.
const readBatch = 1000

// Time's ends, for spans open on one side.
var (
	past   = time.Time{}
	future = time.Unix(1<<40, 0)
)

// span is a stretch of stream time [from, to] in which a mention may
// have been stored that the audit did not read: before --since, removed
// by the stream's limits, after --until.
type span struct{ from, to time.Time }

// message is what the audit takes of a stream message.
type message struct {
	seq     uint64
	ts      time.Time
	subject string
	data    []byte
	probe   bool
}

// cell is one counter's count in the stream: n of the mentions every
// sidecar has written (at or below their stream's checkpoint as the pass
// began, or of a core stream), and the rest one by one (tail), to be
// counted up to the position the counter's item records.
type cell struct {
	n    int64
	tail []pastMention
	// core says some of its mentions came from a core-mode stream, whose
	// sidecars record no position: a count that moves while it is read is
	// in flight there, not wrong.
	core bool
}

// pastMention is one mention past its stream's checkpoint: its stream (an
// index in Config.Streams), its sequence and its count.
type pastMention struct {
	stream int
	seq    uint64
	delta  int64
}

// upTo is the cell's count with its tail up to the positions its items
// record (seq of each stream: 0, none).
func (cl *cell) upTo(seq []uint64) int64 {
	n := cl.n
	for _, m := range cl.tail {
		if m.seq <= seq[m.stream] {
			n, _ = schema.SatAdd(n, m.delta)
		}
	}
	return n
}

// all is the cell's count with its whole tail.
func (cl *cell) all() int64 {
	n := cl.n
	for _, m := range cl.tail {
		n, _ = schema.SatAdd(n, m.delta)
	}
	return n
}

// figures are a pass's count of the messages read.
type figures struct {
	messages, mentions, probes, outside int64
	rejected                            map[string]int64
}

// pass is one read of the streams, counting one share of the topics.
type pass struct {
	share  share
	counts map[schema.Counter]*cell
	topics map[string]struct{}
	// unread are the stretches of time in which mentions may exist that
	// were not read; empty: every mention the streams ever held was read.
	unread []span
	// why says, in notes, where unread comes from.
	why []string
	// totals says whether the pass counts totals: nothing cuts the
	// streams as it begins (a stream may still lose mentions to its
	// limits while it is read: unread says so then).
	totals bool
	figures
	// floors are the streams' checkpoints as the pass began (package
	// durable: every mention at or below is in the table, or held), and
	// held the counters the sidecars held then; tails the mentions past
	// the floors the pass keeps one by one.
	floors []uint64
	held   map[schema.Counter]bool
	tails  int
	// overflow, when not 0, says the counters outgrew MaxCounters: the
	// pass stopped, and its share is to be split this many ways.
	overflow uint64
}

// read reads every stream from its start (or --since) to its end as the
// audit began (or --until and the lateness past it), counting the
// mentions of the topics of sh. shares is how many shares are known, for
// the progress.
func (a *auditor) read(ctx context.Context, sh share, shares int) (*pass, error) {
	a.passes++
	p := &pass{share: sh, counts: make(map[schema.Counter]*cell), topics: make(map[string]struct{}),
		figures: figures{rejected: make(map[string]int64)}}
	var stopAfter time.Time
	if !a.cfg.Until.IsZero() {
		stopAfter = a.cfg.Until.Add(a.cfg.Limits.MaxLateness)
		p.unread = append(p.unread, span{from: stopAfter, to: future})
		p.why = append(p.why, fmt.Sprintf("--until %s: totals not checked; the stream was read up to %s so that late mentions reach the buckets up to --until",
			stamp(a.cfg.Until), stamp(stopAfter)))
	}
	p.totals = a.cfg.Until.IsZero()
	// The checkpoints before the streams are read: what lies past them
	// may not be in the table yet, and is kept one mention at a time.
	var err error
	if p.floors, p.held, err = a.floors(ctx); err != nil {
		return nil, err
	}
	total := int64(0)
	for _, s := range a.streams {
		if !whole(s.info, a.cfg.Now()) && s.info.State.FirstSeq > 1 {
			p.totals = false // its first mentions are gone
		}
		if s.last >= s.info.State.FirstSeq && s.info.State.Msgs > 0 {
			total += int64(s.last - s.info.State.FirstSeq + 1)
		}
	}
	prog := Progress{Pass: a.passes, Shares: shares, Total: total}
	next := a.cfg.Now().Add(a.cfg.ProgressEvery)
	for i, s := range a.streams {
		since := a.cfg.Since
		if !since.IsZero() && !since.After(s.info.Created) {
			since = time.Time{} // before the stream began: all of it
		}
		var rs streamRead
		if s.last > 0 && s.info.State.Msgs > 0 {
			rs, err = a.scan(ctx, s.Name, 0, since, s.last, stopAfter, func(m message) bool {
				p.take(a, i, s.Stream, m)
				prog.Read++
				if a.cfg.Progress != nil {
					if now := a.cfg.Now(); !now.Before(next) {
						a.cfg.Progress(prog)
						next = now.Add(a.cfg.ProgressEvery)
					}
				}
				// One topic's counters are held whole, however many; so
				// are topics whose hashes never part (a share already
				// split 2^32 ways).
				if n := len(p.counts) + p.tails; p.overflow == 0 && n > a.cfg.MaxCounters && len(p.topics) > 1 && sh.mod < 1<<32 {
					p.overflow = splitInto(n, a.cfg.MaxCounters, prog.Read, total)
				}
				return p.overflow == 0
			})
			if err != nil {
				return nil, err
			}
			if p.overflow > 0 {
				return p, nil
			}
		}
		p.lost(a, s, since, rs)
	}
	return p, nil
}

// splitInto is how many ways a share is split whose counters reached n
// after read of about total messages: enough for each part to fit in
// max with a fifth to spare, if the rest of the stream is like what was
// read.
func splitInto(n, max int, read, total int64) uint64 {
	est := float64(n)
	if read > 0 && total > read {
		est *= float64(total) / float64(read)
	}
	k := uint64(est/(0.8*float64(max))) + 1
	return min(max64(k, 2), 1<<16)
}

func max64(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// lost records, after stream s was read (rs), the stretches of time in
// which it may have held mentions that were not read.
func (p *pass) lost(a *auditor, s snapshot, since time.Time, rs streamRead) {
	now := a.cfg.Now()
	w := whole(s.info, now)
	if rs.first.seq != 1 && s.last > 0 {
		// Messages before the first read: gone, or before --since.
		switch {
		case !w:
			to := now
			if rs.first.seq != 0 {
				to = rs.first.ts
			}
			p.unread = append(p.unread, span{from: past, to: to})
			p.why = append(p.why, fmt.Sprintf("stream %s: mentions before %s are no longer in the stream (%s; first sequence %d): totals not checked",
				s.Name, stamp(to), limitsOf(s.info, now), max(rs.first.seq, s.info.State.FirstSeq)))
			if !since.IsZero() {
				p.why = append(p.why, fmt.Sprintf("--since %s: mentions before it not read", stamp(since)))
			}
		case !since.IsZero():
			p.unread = append(p.unread, span{from: past, to: since})
			p.why = append(p.why, fmt.Sprintf("--since %s: mentions before it not read: totals not checked", stamp(since)))
		default:
			// Nothing can have aged out: the first messages were deleted
			// (the probes of `hotcount stream create`).
		}
	}
	if !w {
		// A message missing between two read (deleted, or removed by the
		// limits while the read went on): its time lies between theirs.
		// So do those missing after the last one read.
		p.unread = append(p.unread, rs.gaps...)
		if rs.last.seq != 0 && rs.last.seq < s.last && !rs.stopped {
			p.unread = append(p.unread, span{from: rs.last.ts, to: now})
		}
		if len(rs.gaps) > 0 {
			p.why = append(p.why, fmt.Sprintf("stream %s: %d stretches of messages missing between those read (deleted, or removed by its limits during the read): totals, and the buckets of their time, not checked", s.Name, len(rs.gaps)))
		}
	}
}

// limitsOf says which of a stream's limits removes mentions.
func limitsOf(info *jetstream.StreamInfo, now time.Time) string {
	c := info.Config
	switch {
	case c.Retention != jetstream.LimitsPolicy:
		return fmt.Sprintf("its retention is %s", c.Retention)
	case c.MaxAge > 0 && !info.Created.After(now.Add(-c.MaxAge+time.Minute)):
		return fmt.Sprintf("it keeps them %s, and was created %s", c.MaxAge, stamp(info.Created))
	default:
		return "its limits discard old messages"
	}
}

// take counts message m of stream st (index i) into p.
func (p *pass) take(a *auditor, i int, st Stream, m message) {
	p.messages++
	if m.probe {
		p.probes++ // a check of the routing: the sidecars count nothing of it
		return
	}
	if rules.IsRules(m.subject) {
		return // the stream's rules: no mention, judged by nobody
	}
	j := a.judgement(i, st, m.seq)
	subject := m.subject
	if st.Partitioned {
		subject = streams.Unstored(subject)
	} else if !strings.HasPrefix(subject, a.cfg.Prefix) {
		p.outside++ // the sidecars' consumer takes only --subject
		return
	}
	topic, delta, at, err := ingest.Judge(a.cfg.Prefix, subject, m.data, m.ts, j.limits)
	if err != nil {
		p.rejected[reasonOf(err)]++
		return
	}
	p.mentions += delta
	if !p.share.has(topic) {
		return
	}
	added := false
	for _, c := range a.countersOf(j, topic, at, p.totals) {
		cl := p.counts[c]
		if cl == nil {
			cl = &cell{}
			p.counts[c] = cl
		}
		switch {
		case !st.Durable:
			cl.n, _ = schema.SatAdd(cl.n, delta)
			cl.core = true
		case m.seq > p.floors[i]:
			cl.tail = append(cl.tail, pastMention{stream: i, seq: m.seq, delta: delta})
			p.tails++
		default:
			cl.n, _ = schema.SatAdd(cl.n, delta)
		}
		added = true
	}
	if added {
		p.topics[topic] = struct{}{}
	}
}

// countersOf are the counters a mention of topic at at is counted in
// that the audit may compare: its total (with totals), and its minute
// and hour as --windows has them (those that end by --until, with it).
func (a *auditor) countersOf(j judgement, topic string, at time.Time, totals bool) []schema.Counter {
	var out []schema.Counter
	until := a.cfg.Until
	if totals {
		out = append(out, schema.TotalOf(topic))
	}
	for _, g := range j.windows() {
		i := g.Index(at)
		if until.IsZero() || !g.Start(i+1).After(until) {
			out = append(out, schema.BucketOf(topic, g, i))
		}
	}
	return out
}

// judgement is how the sidecars judge a message: by its stream's rules
// at its sequence, or the audit's settings for a stream without rules.
type judgement struct {
	limits         mention.Limits
	minutes, hours bool
}

// judgement is how the message at seq of stream i (st) is judged.
func (a *auditor) judgement(i int, st Stream, seq uint64) judgement {
	if r, ok := st.Rules.In(store.EpochOf(a.streams[i].info.Created), seq); ok {
		return judgement{limits: r.Limits(), minutes: r.Minutes, hours: r.Hours}
	}
	return judgement{limits: a.cfg.Limits, minutes: a.cfg.Minutes, hours: a.cfg.Hours}
}

// windows are the buckets the sidecars write under j.
func (j judgement) windows() []schema.Granularity {
	var gs []schema.Granularity
	if j.minutes {
		gs = append(gs, schema.Minute)
	}
	if j.hours {
		gs = append(gs, schema.Hour)
	}
	return gs
}

// reasonOf is a rejection's reason, as the sidecars label it.
func reasonOf(err error) string {
	var inv *mention.InvalidError
	if errors.As(err, &inv) {
		return inv.Reason
	}
	return mention.ReasonPayload
}

// streamRead is what one scan of a stream read.
type streamRead struct {
	first, last message // seq 0: none (their data is not kept)
	// gaps are the stretches between two messages read whose sequences
	// are not consecutive.
	gaps []span
	// stopped says the scan stopped at a message after stopAfter.
	stopped bool
}

// scan reads stream name with an ordered consumer from sequence startSeq
// (0: from startTime, or zero: from the start) up to sequence end,
// stopping before a message stored after stopAfter (zero: none), or when
// each returns false. It stops too when the stream holds nothing more
// (messages up to end removed meanwhile).
func (a *auditor) scan(ctx context.Context, name string, startSeq uint64, startTime time.Time, end uint64, stopAfter time.Time, each func(message) bool) (streamRead, error) {
	var r streamRead
	cc := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	switch {
	case startSeq > 0:
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, startSeq
	case !startTime.IsZero():
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &startTime
	}
	cons, err := a.js.OrderedConsumer(ctx, name, cc)
	if err != nil {
		return r, fmt.Errorf("audit: read stream %s: %w", name, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(readBatch))
	if err != nil {
		return r, fmt.Errorf("audit: read stream %s: %w", name, err)
	}
	defer it.Stop()
	for {
		nctx, cancel := context.WithTimeout(ctx, idle)
		msg, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		switch {
		case ctx.Err() != nil:
			return r, fmt.Errorf("audit: read stream %s: %w", name, ctx.Err())
		case errors.Is(err, context.DeadlineExceeded):
			// Nothing came for a while: is anything left to come?
			info, ierr := cons.Info(ctx)
			if ierr == nil && info.NumPending == 0 {
				return r, nil
			}
			continue
		case err != nil:
			return r, fmt.Errorf("audit: read stream %s: %w", name, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return r, fmt.Errorf("audit: read stream %s: %w", name, err)
		}
		seq := md.Sequence.Stream
		if seq > end {
			return r, nil
		}
		if !stopAfter.IsZero() && md.Timestamp.After(stopAfter) {
			r.stopped = true
			return r, nil
		}
		m := message{seq: seq, ts: md.Timestamp, subject: msg.Subject(), data: msg.Data(),
			probe: msg.Headers().Get(streams.ProbeHeader) != ""}
		if r.last.seq != 0 && seq != r.last.seq+1 {
			r.gaps = append(r.gaps, span{from: r.last.ts, to: m.ts})
		}
		if r.first.seq == 0 {
			r.first = message{seq: seq, ts: m.ts}
		}
		r.last = message{seq: seq, ts: m.ts}
		if !each(m) {
			return r, nil
		}
		if seq >= end || md.NumPending == 0 {
			return r, nil
		}
	}
}
