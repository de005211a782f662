// Shares shares gathered totals between the sidecars of a fleet
// over NATS. Every sidecar gathers the topics its application reads, so
// without sharing the read rate on a hot topic's shards is sidecars / TTL:
// at 10,000 sidecars and a 1 s TTL, 10,000 reads a second on every shard,
// past what one DynamoDB partition serves. With sharing, a sidecar that
// gathers a topic publishes the total, and every other sidecar that caches
// the topic takes it as its own fresh gather and skips its refresh: the
// fleet gathers a hot topic about once per TTL.
//
// Totals travel on core NATS, fire and forget: a lost one only means a
// sidecar gathers for itself, as it would without sharing. A total that
// is wrong (a bug, a stray publisher) is undone by the next gather that
// reads lower: it is read again strongly, and the strong read is served
// (lookup.Service's regressions), so a bad total lives at most one TTL.

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultSharesSubject is the subject totals are shared on.
const DefaultSharesSubject = "hotcount.totals"

// Taker takes a peer's total (lookup.Service.Offer).
type Taker interface {
	Offer(topic string, count int64, shards int)
}

// total is the message: a topic's gathered total, from a sidecar, of the
// table (scope) it gathered from.
type total struct {
	From   string `json:"from"`
	Scope  string `json:"scope"`
	Topic  string `json:"topic"`
	Count  int64  `json:"count"`
	Shards int    `json:"shards"`
}

// maxShards bounds a shared total's shard count (hotcount's own bound is
// --max-shards, at most 1,000).
const maxShards = 1000

// Shares publishes this sidecar's gathered totals and, in Run, hands the
// others' to a Taker. Its methods are safe for concurrent use.
type Shares struct {
	nc      *nats.Conn
	subject string
	id      string
	scope   string
	taker   Taker
	sent    prometheus.Counter
	taken   prometheus.Counter
	bad     prometheus.Counter
	dropped atomic.Int64 // publishes that failed; logged once
	log     *zap.Logger
}

// NewShares returns the sharing of totals on subject over nc, handing the
// totals other sidecars publish there to t once Run runs. id tells this
// sidecar's own totals apart (its writer id); scope names what the totals
// are of (the table): totals of another scope, from a deployment on another
// table sharing the NATS server, are not this one's and are ignored. Its
// metrics are registered with reg. It starts nothing.
func NewShares(nc *nats.Conn, subject, id, scope string, t Taker, reg prometheus.Registerer, log *zap.Logger) *Shares {
	s := &Shares{
		nc: nc, subject: subject, id: id, scope: scope, taker: t, log: log.Named("peers"),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_peers_sent_total",
			Help: "Gathered totals this sidecar shared with the fleet (--share-totals).",
		}),
		taken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_peers_received_total",
			Help: "Totals gathered by other sidecars and offered to this one's cache (taken when it caches the topic and the total is not lower).",
		}),
		bad: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_peers_invalid_total",
			Help: "Messages on the totals subject that were not a total (ignored).",
		}),
	}
	reg.MustRegister(s.sent, s.taken, s.bad)
	return s
}

// Run subscribes to the subject and hands the others' totals to the Taker
// until ctx ends; then it unsubscribes and returns nil. It returns the
// error of a subscription that fails. Call it once.
func (s *Shares) Run(ctx context.Context) error {
	msgs := make(chan *nats.Msg, inbox)
	sub, err := s.nc.ChanSubscribe(s.subject, msgs)
	if err != nil {
		return fmt.Errorf("fleet: subscribe %s: %w", s.subject, err)
	}
	for {
		select {
		case <-ctx.Done():
			sub.Unsubscribe() //nolint:errcheck // the connection may be closed already
			return nil
		case m := <-msgs:
			s.take(m)
		}
	}
}

// take hands a total another sidecar shared to the Taker.
func (s *Shares) take(m *nats.Msg) {
	var tot total
	if err := json.Unmarshal(m.Data, &tot); err != nil || tot.Topic == "" || tot.Count < 0 || tot.Shards < 1 || tot.Shards > maxShards {
		s.bad.Inc()
		return
	}
	if tot.From == s.id || tot.Scope != s.scope {
		return
	}
	s.taker.Offer(tot.Topic, tot.Count, tot.Shards)
	s.taken.Inc() // after the offer: a test that sees the count sees the offer's effect
}

// Share publishes a total this sidecar gathered.
func (s *Shares) Share(topic string, count int64, shards int) {
	data, err := json.Marshal(total{From: s.id, Scope: s.scope, Topic: topic, Count: count, Shards: shards})
	if err == nil {
		err = s.nc.Publish(s.subject, data)
	}
	if err != nil {
		if s.dropped.Add(1) == 1 {
			s.log.Warn("a total could not be shared (the fleet gathers it for itself meanwhile)", zap.Error(err))
		}
		return
	}
	s.sent.Inc()
}
