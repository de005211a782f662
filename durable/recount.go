package durable

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/store"
	"github.com/hotcount/hotcount/streams"
)

// recount reads again, from k's stream, the mentions of k's counter at
// sequences from..to, and returns their entry: the rare path of two
// readers whose spans overlap (a frozen reader that woke up, a hand-over),
// where the item holds the first part of a span and the rest must be
// counted exactly. It reads only the topic's subject. A stream that is not
// the one the entry was read from any more (recreated) has nothing to
// add: its mentions went with it.
func (e *Engine) recount(ctx context.Context, k key, from, to uint64) (entry, error) {
	e.metrics.recounts.Inc()
	rest := entry{first: from, last: to}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, k.s.name)
	if err != nil {
		return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	if epochOf(st.CachedInfo()) != k.s.epoch {
		return rest, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.storedSubject(k.s.p, k.c.Topic)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from,
		// Gone soon after the recount: a hand-over may recount hundreds
		// of counters.
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	if cons.CachedInfo().NumPending == 0 {
		return rest, nil
	}
	for {
		batch, err := cons.Fetch(pullBatch, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
			}
			if md.Sequence.Stream > to {
				return e.still(ctx, st, k, rest)
			}
			rest.delta += e.counts(k.c, msg, md.Timestamp)
			if md.NumPending == 0 {
				return e.still(ctx, st, k, rest)
			}
		}
		if err := batch.Error(); err != nil {
			return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
		}
		if n == 0 {
			return entry{}, fmt.Errorf("durable: recount %s: the stream delivered nothing up to %d", k.s.name, to)
		}
	}
}

// counts is what msg adds to counter c: the reader's judgement (take),
// made again.
func (e *Engine) counts(c store.Counter, msg jetstream.Msg, published time.Time) int64 {
	subject := msg.Subject()
	if e.cfg.Partitions > 0 {
		subject = streams.Unstored(subject)
	}
	topic, delta, at, err := ingest.Judge(e.prefix, subject, msg.Data(), published, e.cfg.Limits)
	if err != nil || !e.countsIn(c, topic, at) {
		return 0
	}
	return delta
}

// still returns rest if k's stream is still the one it was read from:
// the ordered consumer makes a new consumer by the stream's name when it
// loses one, so a stream deleted and created during a recount could have
// given it the new stream's messages. Else the entry has nothing to add.
func (e *Engine) still(ctx context.Context, st jetstream.Stream, k key, rest entry) (entry, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	if epochOf(info) != k.s.epoch {
		return entry{first: rest.first, last: rest.last}, nil
	}
	return rest, nil
}
