// Package loadgen publishes synthetic mentions, for demos, tests and
// benchmarks: a number of topics, picked uniformly or with Zipf skew (a few
// hot topics, a long quiet tail), at a rate or as fast as NATS takes them.
// It counts what it sent per topic, so a run can be checked against the
// store to the mention.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	// JetStream publishes with acknowledgements from the stream (up to 4096
	// in flight): Run then reports only what the stream stored. Without it
	// messages are plain core NATS publishes, fire and forget.
	JetStream bool
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
	case c.Count < 1:
		return errors.New("loadgen: count must be at least 1")
	}
	return nil
}

// Report is what a run sent.
type Report struct {
	Messages int64            `json:"messages"`
	Mentions int64            `json:"mentions"`
	Elapsed  time.Duration    `json:"elapsedNs"`
	PerTopic map[string]int64 `json:"perTopic"`
	// Unacknowledged counts JetStream publishes the stream refused or did
	// not answer: they are not in Messages, Mentions or PerTopic.
	Unacknowledged int64 `json:"unacknowledged,omitempty"`
}

// Topic is the name of topic i.
func Topic(i int) string { return "topic-" + strconv.Itoa(i) }

// Run publishes on nc until the duration or the message count is reached or
// ctx ends, flushes the connection so that everything sent has reached the
// server, and reports what it sent.
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
	subjects := make([]string, c.Topics)
	for i := range subjects {
		subjects[i] = c.Prefix + Topic(i)
	}
	var payload []byte
	if c.Count > 1 {
		payload = []byte(`{"count":` + strconv.FormatInt(c.Count, 10) + `}`)
	}

	publish := func(subject string) error { return nc.Publish(subject, payload) }
	var js jetstream.JetStream
	var unacked atomic.Int64
	var (
		refusedMu sync.Mutex
		refused   = map[string]int64{} // by subject: publishes the stream did not acknowledge
	)
	if c.JetStream {
		var err error
		js, err = jetstream.New(nc,
			jetstream.WithPublishAsyncMaxPending(4096),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, _ error) {
				unacked.Add(1)
				refusedMu.Lock()
				refused[m.Subject]++
				refusedMu.Unlock()
			}))
		if err != nil {
			return Report{}, fmt.Errorf("loadgen: %w", err)
		}
		publish = func(subject string) error {
			for {
				_, err := js.PublishAsync(subject, payload)
				if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					return err
				}
				<-js.PublishAsyncComplete() // the window is full: let it empty
			}
		}
	}

	sent := make([]int64, c.Topics)
	start := time.Now()
	var deadline time.Time
	if c.Duration > 0 {
		deadline = start.Add(c.Duration)
	}
	// Pace in 10 ms slots: each slot may send Rate/100 messages.
	const slot = 10 * time.Millisecond
	var n int64
	var err error
loop:
	for {
		if err = ctx.Err(); err != nil {
			break
		}
		now := time.Now()
		if !deadline.IsZero() && now.After(deadline) {
			break
		}
		budget := int64(1000)
		if c.Rate > 0 {
			want := int64(float64(c.Rate) * now.Sub(start).Seconds())
			if budget = want - n; budget <= 0 {
				time.Sleep(slot)
				continue
			}
		}
		for ; budget > 0; budget-- {
			if c.Messages > 0 && n >= c.Messages {
				break loop
			}
			i := pick()
			if err = publish(subjects[i]); err != nil {
				break loop
			}
			sent[i]++
			n++
		}
	}
	if ferr := nc.FlushTimeout(30 * time.Second); ferr != nil && err == nil {
		err = fmt.Errorf("loadgen: flush: %w", ferr)
	}
	if js != nil {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			if err == nil {
				err = errors.New("loadgen: stream acknowledgements still pending after 30s")
			}
		}
		// The report counts what the stream acknowledged, and nothing
		// else: a user comparing it with the store must find it exact.
		refusedMu.Lock()
		for i, subject := range subjects {
			sent[i] -= refused[subject]
		}
		refusedMu.Unlock()
		n -= unacked.Load()
	}
	rep := Report{Messages: n, Mentions: n * c.Count, Elapsed: time.Since(start), PerTopic: make(map[string]int64), Unacknowledged: unacked.Load()}
	for i, k := range sent {
		if k > 0 {
			rep.PerTopic[Topic(i)] = k * c.Count
		}
	}
	if errors.Is(err, context.Canceled) {
		err = nil // stopped by the caller: report what was sent
	}
	return rep, err
}
