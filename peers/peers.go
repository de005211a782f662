// Package peers shares gathered totals between the sidecars of a fleet
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
package peers

import (
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultSubject is the subject totals are shared on.
const DefaultSubject = "hotcount.totals"

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

// Peers publishes this sidecar's gathered totals and hands the others' to
// a Taker. Close unsubscribes.
type Peers struct {
	nc      *nats.Conn
	subject string
	id      string
	scope   string
	sub     *nats.Subscription
	sent    prometheus.Counter
	taken   prometheus.Counter
	bad     prometheus.Counter
	dropped atomic.Int64 // publishes that failed; logged once
	log     *zap.Logger
}

// Join subscribes to subject on nc and hands the totals other sidecars
// publish there to t. id tells this sidecar's own totals apart (its writer
// id); scope names what the totals are of (the table): totals of another
// scope, from a deployment on another table sharing the NATS server, are
// not this one's and are ignored.
func Join(nc *nats.Conn, subject, id, scope string, t Taker, reg prometheus.Registerer, log *zap.Logger) (*Peers, error) {
	p := &Peers{
		nc: nc, subject: subject, id: id, scope: scope, log: log.Named("peers"),
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
	reg.MustRegister(p.sent, p.taken, p.bad)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		var tot total
		if err := json.Unmarshal(m.Data, &tot); err != nil || tot.Topic == "" || tot.Count < 0 || tot.Shards < 1 || tot.Shards > maxShards {
			p.bad.Inc()
			return
		}
		if tot.From == p.id || tot.Scope != p.scope {
			return
		}
		p.taken.Inc()
		t.Offer(tot.Topic, tot.Count, tot.Shards)
	})
	if err != nil {
		return nil, fmt.Errorf("peers: subscribe %s: %w", subject, err)
	}
	p.sub = sub
	return p, nil
}

// Share publishes a total this sidecar gathered.
func (p *Peers) Share(topic string, count int64, shards int) {
	data, err := json.Marshal(total{From: p.id, Scope: p.scope, Topic: topic, Count: count, Shards: shards})
	if err == nil {
		err = p.nc.Publish(p.subject, data)
	}
	if err != nil {
		if p.dropped.Add(1) == 1 {
			p.log.Warn("a total could not be shared (the fleet gathers it for itself meanwhile)", zap.Error(err))
		}
		return
	}
	p.sent.Inc()
}

// Close stops taking totals.
func (p *Peers) Close() error { return p.sub.Unsubscribe() }
