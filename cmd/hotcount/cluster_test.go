package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
)

// The NATS cluster tests' helpers: what the streams stored, and a
// producer on package client.

// storedMentions reads every message of the partition streams, one by
// one, and counts the mentions by topic (probes left out), as
// the sidecars read their payloads.
func storedMentions(t *testing.T, js jetstream.JetStream, l streams.Layout) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	names := []string{l.Stream} // jetstream mode's one stream: Partitions 0
	if l.Partitions > 0 {
		names = names[:0]
		for p := range l.Partitions {
			names = append(names, l.Name(p))
		}
	}
	for _, name := range names {
		// A minute for each stream's thousands of requests: the machine
		// may be busy (one minute for all 16 ran out once).
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		st := s.CachedInfo().State
		for seq := st.FirstSeq; st.Msgs > 0 && seq <= st.LastSeq; seq++ {
			msg, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // a probe, deleted
			}
			if err != nil {
				t.Fatalf("%s: message %d: %v", name, seq, err)
			}
			if msg.Header.Get(streams.ProbeHeader) != "" {
				continue
			}
			pl, err := mention.ParsePayload(msg.Data, math.MaxInt32)
			if err != nil {
				t.Fatalf("%s: a stored message the sidecars would refuse: %v", name, err)
			}
			subject := msg.Subject
			if l.Partitions > 0 {
				subject = streams.Unstored(subject)
			}
			out[strings.TrimPrefix(subject, "mentions.")] += pl.Count
		}
	}
	return out
}

// producer publishes about 2,000 mentions a second over 200 Zipf topics
// with package client, as an application would, and keeps what the
// streams acknowledged, topic by topic.
type producer struct {
	t      *testing.T
	pub    *client.Publisher
	mu     sync.Mutex
	acked  map[string]int64
	failed int
	stop   chan struct{}
	done   chan error
}

func produce(t *testing.T, nc *nats.Conn) *producer {
	t.Helper()
	p := &producer{t: t, acked: map[string]int64{}, stop: make(chan struct{}), done: make(chan error, 1)}
	pub, err := client.NewPublisher(nc, client.WithLinger(20*time.Millisecond), client.WithRetry(2*time.Second, time.Minute),
		client.WithOnDone(func(topic string, n int64, err error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if err != nil {
				p.failed++
				return
			}
			p.acked[topic] += n
		}))
	if err != nil {
		t.Fatal(err)
	}
	p.pub = pub
	go p.run()
	return p
}

func (p *producer) run() {
	rng := rand.New(rand.NewPCG(5, 5))
	zipf := rand.NewZipf(rng, 1.2, 1, 199)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			p.done <- nil
			return
		case <-tick.C:
		}
		for range 2 { // about 2,000 mentions a second
			if err := p.pub.Mention(context.Background(), "topic-"+strconv.FormatUint(zipf.Uint64(), 10), 1); err != nil {
				p.done <- err
				return
			}
		}
	}
}

// total is the mentions acknowledged so far.
func (p *producer) total() (n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.acked {
		n += v
	}
	return n
}

// flowing waits until the streams have acknowledged n more mentions than
// they had at from.
func (p *producer) flowing(from, n int64, what string) {
	p.t.Helper()
	testenv.Eventually(p.t, time.Minute, func() error {
		if got := p.total() - from; got < n {
			return fmt.Errorf("%s: %d of %d mentions acknowledged", what, got, n)
		}
		return nil
	})
}

// finish stops publishing, waits for the last acknowledgements, and
// returns what was acknowledged, topic by topic; a publish that failed
// after its retries fails the test.
func (p *producer) finish(ctx context.Context) map[string]int64 {
	p.t.Helper()
	close(p.stop)
	if err := <-p.done; err != nil {
		p.t.Fatal(err)
	}
	if err := p.pub.Close(ctx); err != nil {
		p.t.Fatalf("producer: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed > 0 {
		p.t.Fatalf("%d publishes failed after their retries", p.failed)
	}
	return p.acked
}
