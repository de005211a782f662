// Package loadgen publishes synthetic mentions, for demos, tests and
// benchmarks: a number of topics, picked uniformly or with Zipf skew (a few
// hot topics, a long quiet tail), at a rate or as fast as NATS takes them,
// or as history: a run's worth of mentions stamped with the times they
// would have had ("at"), published at once. It counts what it sent per
// topic, so a run can be checked against the store to the mention.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/ingest"
)

// Config says what to publish.
type Config struct {
	// Prefix is the subject prefix, like "mentions.".
	Prefix string
	// Topics is the number of distinct topics, named topic-0..topic-(n-1).
	Topics int
	// Zipf is the skew s (> 1) of the topic distribution; 0 is uniform.
	Zipf float64
	// Rate is messages per second; 0 is as fast as possible.
	Rate int
	// Duration bounds the run; 0 is no bound (then Messages must be set).
	Duration time.Duration
	// Messages bounds the number of messages; 0 is no bound.
	Messages int64
	// Count is the count each message carries: 1 publishes empty payloads,
	// more publishes {"count": n}.
	Count int64
	// Seed makes the topic sequence reproducible.
	Seed uint64
	// JetStream publishes with acknowledgements from the stream (up to
	// 4096 in flight), retried with the same Nats-Msg-Id when an
	// acknowledgement is lost: Run then reports only what the stream
	// stored. The stream keeps each id for its duplicate window, about
	// 120 bytes of the server's memory a message (at full speed, 100,000
	// messages/s for the default 2 minutes is over a GiB). Without it
	// messages are plain core NATS publishes, which a slow or absent
	// subscriber drops.
	JetStream bool
	// Surge, when set, is a topic published besides the others at
	// SurgeRate messages per second from SurgeAfter into the run: a topic
	// that starts trending, for /v1/trending.
	Surge      string
	SurgeRate  int
	SurgeAfter time.Duration
	// Backfill publishes the run as history: the Duration before the start
	// of the run, at Rate (and the surge at SurgeRate from SurgeAfter into
	// it), each message stamped with its time in it ("at", which the
	// sidecar counts in that time's buckets), as fast as NATS takes them.
	// It needs a Duration and a Rate; the sidecar refuses mentions older
	// than its --max-lateness (a day by default).
	Backfill bool
}

// Validate checks c.
func (c Config) Validate() error {
	switch {
	case c.Topics < 1:
		return errors.New("loadgen: topics must be at least 1")
	case c.Zipf != 0 && c.Zipf <= 1:
		return errors.New("loadgen: zipf must be 0 (uniform) or greater than 1")
	case c.Rate < 0:
		return errors.New("loadgen: rate must not be negative")
	case c.Duration <= 0 && c.Messages <= 0:
		return errors.New("loadgen: set a duration or a number of messages")
	case c.Surge != "" && c.SurgeRate < 1:
		return errors.New("loadgen: a surge needs a surge rate of at least 1 message per second")
	case c.SurgeAfter < 0:
		return errors.New("loadgen: surge-after must not be negative")
	case c.Count < 1 || c.Count > ingest.DefaultMaxCount:
		return fmt.Errorf("loadgen: count must be in 1..%d (the sidecar's default --max-count)", ingest.DefaultMaxCount)
	case c.Backfill && (c.Duration <= 0 || c.Rate < 1):
		return errors.New("loadgen: a backfill needs a duration (how far back it starts) and a rate (messages per second of that history)")
	}
	return nil
}

// Report is what a run sent.
type Report struct {
	// Counted says what the counts are: "stream" (each message was
	// acknowledged by a JetStream stream: stored) or "server" (core NATS:
	// the server received each, and a slow or absent subscriber may
	// still have dropped it).
	Counted  string           `json:"counted"`
	Messages int64            `json:"messages"`
	Mentions int64            `json:"mentions"`
	Elapsed  time.Duration    `json:"elapsedNs"`
	PerTopic map[string]int64 `json:"perTopic"`
	// Unacknowledged counts messages given up: JetStream publishes the
	// stream refused or did not acknowledge within the retries (each may
	// or may not be stored), core publishes the connection refused. They
	// are not in Messages, Mentions or PerTopic.
	Unacknowledged int64 `json:"unacknowledged,omitempty"`
	// From and To bound the times a backfill stamped its mentions with.
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
}

const (
	// maxInFlight is the JetStream publishes waiting for their
	// acknowledgement at once: enough to keep a local server busy.
	maxInFlight = 4096
	// closeTimeout bounds the wait for the last acknowledgements.
	closeTimeout = 30 * time.Second
)

// Topic is the name of topic i.
func Topic(i int) string { return "topic-" + strconv.Itoa(i) }

// Run publishes on nc until the duration or the message count is reached or
// ctx ends, with a client.Publisher that does not coalesce (each message
// is one mention event of Count), and reports what was published: with
// JetStream, what the stream acknowledged; in core NATS, what the server
// confirmed reading (a round trip after the last message).
func Run(ctx context.Context, nc *nats.Conn, c Config) (Report, error) {
	if err := c.Validate(); err != nil {
		return Report{}, err
	}
	r := rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	pick := func() int { return r.IntN(c.Topics) }
	if c.Zipf > 1 {
		z := rand.NewZipf(r, c.Zipf, 1, uint64(c.Topics-1))
		pick = func() int { return int(z.Uint64()) }
	}
	topics := make([]string, c.Topics)
	for i := range topics {
		topics[i] = Topic(i)
	}

	// The report counts what the Publisher says was published, message by
	// message, and nothing else: a user comparing it with the store must
	// find it exact.
	var (
		mu  sync.Mutex
		rep = Report{Counted: "server", PerTopic: make(map[string]int64)}
	)
	if c.JetStream {
		rep.Counted = "stream"
	}
	opts := []client.PublisherOption{
		client.WithSubjectPrefix(c.Prefix),
		client.WithLinger(0), // one message per event: the load is in messages
		client.WithOnDone(func(topic string, n int64, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rep.Unacknowledged++
				return
			}
			rep.Messages++
			rep.Mentions += n
			rep.PerTopic[topic] += n
		}),
	}
	if c.JetStream {
		opts = append(opts, client.WithMaxInFlight(maxInFlight))
	} else {
		opts = append(opts, client.WithCoreNATS())
	}
	p, err := client.NewPublisher(nc, opts...)
	if err != nil {
		return Report{}, fmt.Errorf("loadgen: %w", err)
	}

	start := time.Now()
	// The run's clock: the time since its start, or in a backfill a clock
	// of its own that moves a slot at a time without waiting, from
	// Duration before the start to the start.
	var virtual time.Duration
	elapsed := func() time.Duration { return time.Since(start) }
	if c.Backfill {
		elapsed = func() time.Duration { return virtual }
		rep.From, rep.To = start.Add(-c.Duration), start
	}
	// Pace in 10 ms slots: each slot may send Rate/100 messages.
	const slot = 10 * time.Millisecond
	var n, surged int64
loop:
	for {
		if err = ctx.Err(); err != nil {
			break
		}
		e := elapsed()
		if c.Duration > 0 && e > c.Duration {
			break
		}
		mention := func(topic string) error { return p.Mention(ctx, topic, c.Count) }
		if c.Backfill {
			at := start.Add(e - c.Duration)
			mention = func(topic string) error { return p.MentionAt(ctx, topic, c.Count, at) }
			virtual += slot // the next round is a slot later
		}
		if c.Surge != "" && e > c.SurgeAfter {
			want := int64(float64(c.SurgeRate) * (e - c.SurgeAfter).Seconds())
			for ; surged < want; surged++ {
				if c.Messages > 0 && n >= c.Messages {
					break loop
				}
				if err = mention(c.Surge); err != nil {
					break loop
				}
				n++
			}
		}
		budget := int64(1000)
		if c.Rate > 0 {
			want := int64(float64(c.Rate)*e.Seconds()) + surged
			if budget = want - n; budget <= 0 {
				if !c.Backfill {
					time.Sleep(slot)
				}
				continue
			}
		}
		for ; budget > 0; budget-- {
			if c.Messages > 0 && n >= c.Messages {
				break loop
			}
			if err = mention(topics[pick()]); err != nil {
				break loop
			}
			n++
		}
	}
	if errors.Is(err, context.Canceled) {
		err = nil // stopped by the caller: report what was published
	}
	// Close waits for every acknowledgement (or, in core NATS, for the
	// server's answer to a PING sent after the last message), even when
	// ctx ended the run.
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	if cerr := p.Close(closeCtx); cerr != nil && err == nil {
		var given *client.PublishError
		// Messages given up alone are in the report, as unacknowledged.
		if !errors.As(cerr, &given) || error(given) != cerr {
			err = fmt.Errorf("loadgen: %w", cerr)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	rep.Elapsed = time.Since(start)
	return rep, err
}
