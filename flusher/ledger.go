package flusher

import (
	"cmp"
	"context"
	"errors"
	"iter"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/store"
)

// retireTimeout bounds the retirements of one flush.
const retireTimeout = 500 * time.Millisecond

// ledger is what this writer still owes: its pending writes (in doubt, or
// journaled and not yet in the store), their journal entries, and the
// acknowledgement of the messages behind them. A message is acknowledged
// once every count it makes is written or journaled, in stream order.
//
// It is not safe for concurrent use. The Flusher owns it, and only the
// goroutine holding Flusher.flushMu uses it, with one exception: a
// pending write being sent again (resendable) is its write's goroutine's
// (answered) until the flush takes that write's answer.
type ledger struct {
	journal   Journal // nil: core mode
	seq       *store.Sequencer
	keepAlive time.Duration // Config.KeepAlive
	log       *zap.Logger
	metrics   *Metrics
	now       func() time.Time

	pending   map[store.Counter]*pending // writes in doubt or journaled
	entries   map[string]int             // journal entry -> its writes not yet in the store
	unretired []string                   // journal entries settled, not yet deleted
}

// pending is a write sent again unchanged until it is in the store: a
// write in doubt, or (with a journal) any journaled write. The ledger owns
// it (see ledger for the one exception). msgs are the
// messages (JetStream mode) whose counts wait for it; entry is its journal
// entry.
type pending struct {
	write       store.Write
	msgs        []aggregator.Message
	entry       string    // journal entry key; "" without a journal
	recordedAt  time.Time // when the entry was recorded
	unconfirmed bool      // the entry's put lost its answer: not sent yet
	denied      denial    // its run of refusals for good
	// handedOver: its journal entry marks it as the quarantine's (see
	// Flusher.handOver), so it is never sent again; only the hand-over's
	// last step is left.
	handedOver bool
}

func newLedger(j Journal, seq *store.Sequencer, keepAlive time.Duration, log *zap.Logger, m *Metrics, now func() time.Time) *ledger {
	return &ledger{journal: j, seq: seq, keepAlive: keepAlive, log: log, metrics: m, now: now,
		pending: make(map[store.Counter]*pending), entries: make(map[string]int)}
}

// waiting returns the topics with a write pending (in doubt or
// journaled), of their total or of a time bucket.
func (l *ledger) waiting() map[string]bool {
	w := make(map[string]bool, len(l.pending))
	for c := range l.pending {
		w[c.Topic] = true
	}
	return w
}

// record journals writes, with the stream sequences of the messages
// behind their topics, and makes each recorded write pending: from now on
// the journal carries its counts, and the write is sent until it is in the
// store, unchanged (a journaled write never moves to another shard; a
// replay after a crash sends it where the journal says). It returns the
// entries of the writes recorded, by counter, and when they were recorded;
// the others wait for the next flush.
func (l *ledger) record(ctx context.Context, writes []store.Write, acks []aggregator.Message) (map[store.Counter]journal.Recorded, time.Time) {
	seqs := make(map[string][]int64, len(writes))
	for _, m := range acks {
		seqs[m.Topic] = append(seqs[m.Topic], m.Seq)
	}
	recs, err := l.journal.Record(ctx, writes, seqs)
	recorded := make(map[store.Counter]journal.Recorded, len(writes))
	for _, r := range recs {
		for _, c := range r.Counters {
			recorded[c] = r
		}
		l.entries[r.Key] = len(r.Counters)
	}
	if err != nil {
		l.log.Warn("journal incomplete; the rest waits for the next flush", zap.Int("recorded", len(recorded)), zap.Int("topics", len(writes)), zap.Error(err))
	}
	at := l.now()
	for _, w := range writes {
		if r, ok := recorded[w.Counter]; ok {
			l.pending[w.Counter] = &pending{write: w, entry: r.Key, recordedAt: at, unconfirmed: r.Unconfirmed}
		}
	}
	return recorded, at
}

// ackRecorded acknowledges, in order, the messages whose counts are surely
// journaled (with their topic's total: a topic's writes share an entry);
// an unconfirmed entry's messages wait with its pending writes, and those
// of topics not recorded are returned, to go back with their deltas.
func (l *ledger) ackRecorded(acks []aggregator.Message, recorded map[store.Counter]journal.Recorded) (back []aggregator.Message) {
	kept := l.ack(acks, func(topic string) bool { r, ok := recorded[store.TotalOf(topic)]; return !ok || r.Unconfirmed })
	for _, m := range kept {
		if _, ok := recorded[store.TotalOf(m.Topic)]; ok {
			p := l.pending[store.TotalOf(m.Topic)]
			p.msgs = append(p.msgs, m)
		} else {
			back = append(back, m)
		}
	}
	return back
}

// confirm settles the unconfirmed journal entries (see journal.Recorded):
// once one is surely recorded, its messages are acknowledged and its writes
// may go.
func (l *ledger) confirm(ctx context.Context) {
	byEntry := map[string][]*pending{}
	for _, p := range l.pending {
		if p.unconfirmed {
			byEntry[p.entry] = append(byEntry[p.entry], p)
		}
	}
	for key, ps := range byEntry {
		ok, err := l.journal.Confirm(ctx, key)
		if !ok {
			l.log.Warn("journal entry still unconfirmed; its topics wait", zap.String("key", key), zap.Error(err))
			continue
		}
		var msgs []aggregator.Message
		for _, p := range ps {
			msgs = append(msgs, p.msgs...)
			p.msgs, p.unconfirmed = nil, false
		}
		slices.SortFunc(msgs, func(a, b aggregator.Message) int { return cmp.Compare(a.Seq, b.Seq) })
		l.ackAll(msgs)
	}
}

// retire deletes the journal entries whose writes are all in the store;
// one that fails stays listed for the next flush (left in the journal, it
// would only be replayed, and refused by the marks, once this writer is
// gone).
func (l *ledger) retire(ctx context.Context) {
	if len(l.unretired) == 0 {
		return
	}
	// Retiring waits for the consumer's ack floor, a request to NATS: a
	// slow JetStream (a cluster electing leaders) must not eat the flush's
	// time for writes. An entry left is only retired later.
	ctx, cancel := context.WithTimeout(ctx, retireTimeout)
	defer cancel()
	var left []string
	for _, key := range l.unretired {
		switch err := l.journal.Settled(ctx, key); {
		case errors.Is(err, journal.ErrNotAcknowledged):
			left = append(left, key) // the usual case for the latest entries
		case err != nil:
			l.log.Warn("journal entry not retired; trying again next flush", zap.Error(err))
			left = append(left, key)
		}
	}
	l.unretired = left
}

// resendable yields, by counter, the pending writes to send again, while
// more says so: all but those of unconfirmed entries. A journaled write
// another sidecar may have replayed is marked so, so that a refusal by
// the mark reads as applied.
func (l *ledger) resendable(more func() bool) iter.Seq2[store.Counter, *pending] {
	return func(yield func(store.Counter, *pending) bool) {
		for c, p := range l.pending {
			if !more() {
				return
			}
			if p.unconfirmed || p.handedOver {
				continue
			}
			if p.entry != "" && l.journal.MaybeReplayed(p.recordedAt) {
				p.write.Replay = true
			}
			if !yield(c, p) {
				return
			}
		}
	}
}

// quarantine hands handOver each pending write whose run of refusals for good
// is ripe, and returns, by counter, those it took, still pending: settle
// them. Only a write never in doubt goes (its every answer said "not
// applied"): one that may be in the store already (Retry, or Replay: its
// journal entry may have been replayed by another sidecar) stays pending,
// since a replay under another identity could count it twice.
func (l *ledger) quarantine(ctx context.Context, handOver func(context.Context, store.Write, string, denial, bool) (bool, bool), ripe func(store.Counter, denial) bool) map[store.Counter]int64 {
	var moved map[store.Counter]int64
	for c, p := range l.pending {
		if !p.handedOver {
			if p.unconfirmed || p.write.Retry || p.write.Replay || !ripe(c, p.denied) {
				continue
			}
			if p.entry != "" && l.journal.MaybeReplayed(p.recordedAt) {
				continue // since this flush's sends: another sidecar may be writing it
			}
		}
		marked, done := handOver(ctx, p.write, p.entry, p.denied, p.handedOver)
		p.handedOver = marked
		if done {
			if moved == nil {
				moved = make(map[store.Counter]int64)
			}
			moved[c] = p.write.Delta
		}
	}
	return moved
}

// writes is how many writes are pending.
func (l *ledger) writes() int { return len(l.pending) }

// answered takes the answer to p sent again, in p's write's goroutine (only
// it touches p until the flush takes the answer): a write in doubt is sent
// as a retry from now on, and a journaled one below the item's floor gets
// a new seq if its entry can be rewritten with it (nothing was applied).
func (l *ledger) answered(ctx context.Context, p *pending, a answer) {
	if a.outcome == inDoubt {
		p.write.Retry = true
	}
	p.denied.answered(a.err, l.now())
	var behind *store.FloorError
	if errors.As(a.err, &behind) && p.entry != "" {
		if seq := l.seq.Next(); l.journal.Rewrite(ctx, p.entry, p.write.Counter, seq) == nil {
			p.write.Seq = seq
		}
	}
}

// settle drops the pending writes now in the store (by counter): their
// messages are acknowledged once their topic has no other write pending,
// and entries left with no write pending are retired.
func (l *ledger) settle(ctx context.Context, settled map[store.Counter]int64) {
	var done []aggregator.Message
	var retire []string
	for c := range settled {
		p := l.pending[c]
		done = append(done, p.msgs...)
		if p.entry != "" {
			if l.entries[p.entry]--; l.entries[p.entry] == 0 {
				delete(l.entries, p.entry)
				retire = append(retire, p.entry)
			}
		}
		delete(l.pending, c)
	}
	l.ackAll(l.stillWaiting(done))
	l.unretired = append(l.unretired, retire...)
	if len(retire) > 0 {
		l.retire(ctx)
	}
}

// ackWritten acknowledges, in stream order, the messages of acks whose
// every count is written, and makes each new write in doubt pending. A
// message waits while any count of its topic is unwritten (its topic in
// unwritten: returned, to go back to the buffer with it) or in doubt (kept
// with that write).
func (l *ledger) ackWritten(acks []aggregator.Message, unwritten map[string]bool, doubt map[store.Counter]store.Write) (back []aggregator.Message) {
	unsure := make(map[string]store.Counter, len(doubt))
	for c := range doubt {
		unsure[c.Topic] = c
	}
	kept := l.ack(acks, func(topic string) bool { _, doubted := unsure[topic]; return unwritten[topic] || doubted })
	for c, w := range doubt {
		l.addPending(c, w)
	}
	for _, m := range kept {
		if c, doubted := unsure[m.Topic]; doubted && !unwritten[m.Topic] {
			p := l.pending[c]
			p.msgs = append(p.msgs, m)
		} else {
			back = append(back, m)
		}
	}
	return back
}

// stillWaiting returns the messages of ms whose topic has no write pending
// any more, and hands the others to one of their topic's pending writes:
// a message is done when all its counts are.
func (l *ledger) stillWaiting(ms []aggregator.Message) (done []aggregator.Message) {
	if len(ms) == 0 {
		return nil
	}
	by := make(map[string]*pending, len(l.pending))
	for c, p := range l.pending {
		by[c.Topic] = p
	}
	for _, m := range ms {
		if p := by[m.Topic]; p != nil {
			p.msgs = append(p.msgs, m)
		} else {
			done = append(done, m)
		}
	}
	return done
}

// addPending makes w c's pending write, unless c has one.
func (l *ledger) addPending(c store.Counter, w store.Write) {
	if _, ok := l.pending[c]; !ok {
		w.Retry = true
		l.pending[c] = &pending{write: w}
	}
}

// keepPending publishes how many writes are pending and keeps their messages
// this sidecar's while they wait.
func (l *ledger) keepPending() {
	l.metrics.pending.Set(float64(len(l.pending)))
	for _, p := range l.pending {
		l.keepAliveAll(p.msgs)
	}
}

// ack acknowledges, in order, the messages whose topic keep does not
// want, and returns the others. An ack that cannot be sent leaves its
// message to be redelivered and counted again (the at-least-once
// over-count); it is counted.
func (l *ledger) ack(ms []aggregator.Message, keep func(topic string) bool) (kept []aggregator.Message) {
	var done []aggregator.Message
	for _, m := range ms {
		if keep(m.Topic) {
			kept = append(kept, m)
		} else {
			done = append(done, m)
		}
	}
	l.ackAll(done)
	return kept
}

func (l *ledger) ackAll(ms []aggregator.Message) {
	for _, m := range ms {
		if err := m.Msg.Ack(); err != nil {
			l.metrics.ackErrors.Inc()
		}
	}
	l.metrics.acked.Add(float64(len(ms)))
}

// keepAliveWhile resets the redelivery timer of ms every Config.KeepAlive
// until the returned stop is called (which waits for the goroutine). The
// drained messages leave the buffer the ingest keeps alive: a slow flush
// (a cold start, a slow store) must never let the server hand them to
// another sidecar while this one still counts them.
func (l *ledger) keepAliveWhile(ms []aggregator.Message) (stop func()) {
	if l.keepAlive <= 0 || len(ms) == 0 {
		return func() {}
	}
	held := make([]aggregator.Acker, len(ms))
	for i, m := range ms {
		held[i] = m.Msg
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(l.keepAlive)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range held {
					m.InProgress() //nolint:errcheck // best effort; an acked message ignores it
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// keepAliveAll resets the redelivery timer of messages that go back to
// wait: they stay this sidecar's, and are not handed to another replica
// (which would count them twice) while this one holds them.
func (l *ledger) keepAliveAll(ms []aggregator.Message) {
	for _, m := range ms {
		m.Msg.InProgress() //nolint:errcheck // best effort: at worst a redelivery, counted twice
	}
}

// atExit hands back for redelivery the messages held by pending writes, and
// says how many mentions are left in writes in doubt and in the journal,
// for the shutdown's report.
func (l *ledger) atExit() (doubt, journaled int64, handedBack int) {
	for c, p := range l.pending {
		switch {
		case c.IsBucket():
			// A time bucket's write: its mentions are counted
			// with their topic's.
		case p.entry != "":
			journaled += p.write.Delta // another sidecar replays it
		default:
			doubt += p.write.Delta
		}
		for _, m := range p.msgs {
			if m.Msg.Nak() == nil {
				handedBack++
			}
		}
	}
	return doubt, journaled, handedBack
}
