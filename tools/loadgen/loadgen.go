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
	"github.com/hotcount/hotcount/mention"
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
	// Contributors, when above 0, has each message name its contributor
	// ("by"): one of that many ids (c0, c1, ...), drawn uniformly, the
	// same sequence for the same seed.
	Contributors int
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
	case c.Contributors < 0:
		return errors.New("loadgen: contributors must not be negative")
	case c.SurgeAfter < 0:
		return errors.New("loadgen: surge-after must not be negative")
	case c.Count < 1 || c.Count > mention.DefaultMaxCount:
		return fmt.Errorf("loadgen: count must be in 1..%d (the sidecar's default --max-count)", mention.DefaultMaxCount)
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
	t := newTally(c)
	p, err := newPublisher(nc, c, t)
	if err != nil {
		return Report{}, fmt.Errorf("loadgen: %w", err)
	}
	g := newGenerator(c, p)
	err = g.publish(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil // stopped by the caller: report what was published
	}
	if cerr := closePublisher(ctx, p); cerr != nil && err == nil {
		err = cerr
	}
	return t.report(c, g.start), err
}

// tally is the report the Publisher fills in, message by message, as it
// learns each message's fate: it counts what the Publisher says was
// published and nothing else, so that a user comparing it with the store
// finds it exact.
type tally struct {
	mu  sync.Mutex // the Publisher calls done from its own goroutines
	rep Report
}

func newTally(c Config) *tally {
	t := &tally{rep: Report{Counted: "server", PerTopic: make(map[string]int64)}}
	if c.JetStream {
		t.rep.Counted = "stream"
	}
	return t
}

// done counts a message of n mentions of topic as published, or, with err,
// as given up.
func (t *tally) done(topic string, n int64, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.rep.Unacknowledged++
		return
	}
	t.rep.Messages++
	t.rep.Mentions += n
	t.rep.PerTopic[topic] += n
}

// report is the run's report, for a run that started at start.
func (t *tally) report(c Config, start time.Time) Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	rep := t.rep
	rep.Elapsed = time.Since(start)
	if c.Backfill {
		rep.From, rep.To = start.Add(-c.Duration), start
	}
	return rep
}

// newPublisher returns a Publisher that sends each mention event as its own
// message, over JetStream or core NATS as c says, and tells t each
// message's fate.
func newPublisher(nc *nats.Conn, c Config, t *tally) (*client.Publisher, error) {
	opts := []client.PublisherOption{
		client.WithSubjectPrefix(c.Prefix),
		client.WithLinger(0), // one message per event: the load is in messages
		client.WithOnDone(t.done),
	}
	if c.JetStream {
		opts = append(opts, client.WithMaxInFlight(maxInFlight))
	} else {
		opts = append(opts, client.WithCoreNATS())
	}
	return client.NewPublisher(nc, opts...)
}

// closePublisher waits for every acknowledgement (or, in core NATS, for the
// server's answer to a PING sent after the last message), even when ctx
// ended the run, and returns what went wrong besides messages given up.
func closePublisher(ctx context.Context, p *client.Publisher) error {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	err := p.Close(closeCtx)
	if err == nil {
		return nil
	}
	var given *client.PublishError
	// Messages given up alone are in the report, as unacknowledged.
	if errors.As(err, &given) && error(given) == err {
		return nil
	}
	return fmt.Errorf("loadgen: %w", err)
}

// slot is the pace's unit: each 10 ms slot may send Rate/100 messages.
const slot = 10 * time.Millisecond

// generator is one run's publishing loop and the state it keeps between
// slots.
type generator struct {
	c      Config
	p      *client.Publisher
	topics []string
	pick   func() int // the index in topics of the next mention's topic
	who    *rand.Rand // draws each message's contributor
	start  time.Time
	// virtual is a backfill's clock: it moves a slot at a time without
	// waiting, from Duration before the start to the start.
	virtual time.Duration
	// n counts the messages sent, surged those of them of the surge topic.
	n, surged int64
}

func newGenerator(c Config, p *client.Publisher) *generator {
	topics := make([]string, c.Topics)
	for i := range topics {
		topics[i] = Topic(i)
	}
	who := rand.New(rand.NewPCG(c.Seed^0x5bd1e995, c.Seed))
	return &generator{c: c, p: p, topics: topics, pick: picker(c), who: who, start: time.Now()}
}

// picker returns the topic sequence: uniform, or with Zipf skew, the same
// for the same seed.
func picker(c Config) func() int {
	r := rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	if c.Zipf > 1 {
		z := rand.NewZipf(r, c.Zipf, 1, uint64(c.Topics-1))
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return r.IntN(c.Topics) }
}

// elapsed is the run's clock: the time since its start, or in a backfill
// the virtual clock.
func (g *generator) elapsed() time.Duration {
	if g.c.Backfill {
		return g.virtual
	}
	return time.Since(g.start)
}

// publish sends slot after slot until the duration or the message count is
// reached, a mention fails or ctx ends, and returns why it stopped (nil
// for a bound reached).
func (g *generator) publish(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		e := g.elapsed()
		if g.c.Duration > 0 && e > g.c.Duration {
			return nil
		}
		if g.c.Backfill {
			g.virtual += slot // the next round is a slot later
		}
		if g.c.Surge != "" && e > g.c.SurgeAfter {
			want := int64(float64(g.c.SurgeRate) * (e - g.c.SurgeAfter).Seconds())
			before := g.n
			stop, err := g.send(ctx, e, want-g.surged, func() string { return g.c.Surge })
			g.surged += g.n - before
			if stop {
				return err
			}
		}
		budget := int64(1000)
		if g.c.Rate > 0 {
			want := int64(float64(g.c.Rate)*e.Seconds()) + g.surged
			if budget = want - g.n; budget <= 0 {
				if !g.c.Backfill {
					time.Sleep(slot)
				}
				continue
			}
		}
		if stop, err := g.send(ctx, e, budget, func() string { return g.topics[g.pick()] }); stop {
			return err
		}
	}
}

// send publishes up to k messages of topic() at the run's time e, and says
// whether the run is over: the message count reached, or a mention failed
// (err).
func (g *generator) send(ctx context.Context, e time.Duration, k int64, topic func() string) (stop bool, err error) {
	for ; k > 0; k-- {
		if g.c.Messages > 0 && g.n >= g.c.Messages {
			return true, nil
		}
		if err := g.mention(ctx, topic(), e); err != nil {
			return true, err
		}
		g.n++
	}
	return false, nil
}

// mention publishes one message of topic; in a backfill, stamped with the
// time the run's time e stands for.
func (g *generator) mention(ctx context.Context, topic string, e time.Duration) error {
	var at time.Time
	if g.c.Backfill {
		at = g.start.Add(e - g.c.Duration)
	}
	if g.c.Contributors > 0 {
		return g.p.MentionBy(ctx, topic, "c"+strconv.Itoa(g.who.IntN(g.c.Contributors)), g.c.Count, at)
	}
	return g.p.MentionAt(ctx, topic, g.c.Count, at)
}
