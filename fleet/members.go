// Members keeps the set of live sidecars of a fleet and divides the
// stream's partitions among them (partitioned mode).
//
// Each sidecar announces itself on a core NATS subject every interval and
// listens to the others. A sidecar not heard from for Expiry intervals has
// gone (a crash, a lost pod); one that stops cleanly says so and goes at
// once. Every sidecar computes the owner of each partition from the set it
// sees by rendezvous hashing, so the sidecars agree on the owners whenever
// they agree on the set, and a change of the set moves only the partitions
// of the sidecar that came or went. While views differ (for an interval or
// so after a change) two sidecars may both claim a partition: the stream's
// consumers pin each partition to one puller at a time, so the claim that
// loses simply receives nothing (see ingest.Partitioned).

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// DefaultMembersSubject is the subject sidecars announce themselves on.
const DefaultMembersSubject = "hotcount.fleet"

// DefaultInterval is how often a sidecar announces itself.
const DefaultInterval = time.Second

// Expiry is how many intervals without an announcement make a sidecar gone.
const Expiry = 3

// announcement is the message: a sidecar of a scope (the table and the
// stream it consumes) is alive, or leaving.
type announcement struct {
	ID      string `json:"id"`
	Scope   string `json:"scope"`
	Leaving bool   `json:"leaving,omitempty"`
}

// inbox is how many messages a subscription of this package holds for its
// Run (nats.go's default for a subscription); past it nats.go drops them
// and reports a slow consumer.
const inbox = nats.DefaultMaxChanLen

// Members is this sidecar's view of the live sidecars. Its methods are
// safe for concurrent use; Run announces and listens.
type Members struct {
	nc       *nats.Conn
	subject  string
	self     announcement
	interval time.Duration
	log      *zap.Logger
	changed  chan struct{}

	mu      sync.Mutex
	started time.Time            // when Run began to listen; zero before
	seen    map[string]time.Time // id → last announcement
	heard   time.Time            // when this sidecar last heard its own announcement
}

// NewMembers returns the view of the sidecar id, of scope (the stream and
// consumer it shares with the others), announcing itself and listening on
// subject every interval once Run runs. It starts nothing.
func NewMembers(nc *nats.Conn, subject, id, scope string, interval time.Duration, log *zap.Logger) *Members {
	return &Members{
		nc: nc, subject: subject, interval: interval, log: log.Named("fleet"),
		self:    announcement{ID: id, Scope: scope},
		changed: make(chan struct{}, 1),
		seen:    map[string]time.Time{id: {}},
	}
}

// Run subscribes to the subject, announces the sidecar every interval and
// tracks the other sidecars of its scope until ctx ends; then it tells them
// it is gone, so that they take its partitions at once rather than after
// Expiry intervals, and returns nil. It returns the error of a
// subscription that fails. Call it once.
func (m *Members) Run(ctx context.Context) error {
	msgs := make(chan *nats.Msg, inbox)
	sub, err := m.nc.ChanSubscribe(m.subject, msgs)
	if err != nil {
		return fmt.Errorf("fleet: subscribe %s: %w", m.subject, err)
	}
	now := time.Now()
	m.mu.Lock()
	m.started, m.heard, m.seen[m.self.ID] = now, now, now
	m.mu.Unlock()
	m.announce(false)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			sub.Unsubscribe() //nolint:errcheck // the connection closes next
			m.announce(true)
			m.nc.Flush() //nolint:errcheck // best effort: the others expire it anyway
			return nil
		case msg := <-msgs:
			m.receive(msg)
		case <-t.C:
			m.announce(false)
			m.expire()
		}
	}
}

// Settled says whether the sidecar has listened long enough to have heard
// every live sidecar at least once: before that, it should not claim
// partitions the others still own.
func (m *Members) Settled() bool {
	m.mu.Lock()
	started := m.started
	m.mu.Unlock()
	return !started.IsZero() && time.Since(started) > m.interval*3/2
}

// Live returns the live sidecars' ids, sorted, this one included.
func (m *Members) Live() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.seen))
	for id := range m.seen {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Changed receives a value when the set of members changes.
func (m *Members) Changed() <-chan struct{} { return m.changed }

// Owned returns the partitions of 0..n-1 this sidecar owns in its view.
func (m *Members) Owned(n int) []int {
	live := m.Live()
	var out []int
	for p := range n {
		if Owner(p, live) == m.self.ID {
			out = append(out, p)
		}
	}
	return out
}

func (m *Members) announce(leaving bool) {
	a := m.self
	a.Leaving = leaving
	b, _ := json.Marshal(a)
	if err := m.nc.Publish(m.subject, b); err != nil {
		m.log.Warn("announce", zap.Error(err))
	}
}

func (m *Members) receive(msg *nats.Msg) {
	var a announcement
	if err := json.Unmarshal(msg.Data, &a); err != nil || a.ID == "" || a.Scope != m.self.Scope {
		return // not one of this fleet's sidecars
	}
	if a.ID == m.self.ID {
		m.mu.Lock()
		m.heard = time.Now() // the subject carries this sidecar's voice: it hears the others too
		m.mu.Unlock()
		return
	}
	m.mu.Lock()
	_, known := m.seen[a.ID]
	if a.Leaving {
		delete(m.seen, a.ID)
	} else {
		m.seen[a.ID] = time.Now()
	}
	m.mu.Unlock()
	switch {
	case a.Leaving && known:
		m.log.Info("sidecar left", zap.String("id", a.ID))
		m.signal()
	case !a.Leaving && !known:
		m.log.Info("sidecar joined", zap.String("id", a.ID))
		m.signal()
	}
}

// expire forgets the sidecars not heard from for Expiry intervals of this
// sidecar hearing itself. Time alone is not enough: a sidecar cut off (a
// lost NATS connection, a long pause) hears nobody, itself included, and
// forgetting the others would have it claim every partition; measured
// against its own voice, its view stays as it was until it hears again.
func (m *Members) expire() {
	m.mu.Lock()
	var gone []string
	for id, at := range m.seen {
		if id != m.self.ID && m.heard.Sub(at) > Expiry*m.interval {
			delete(m.seen, id)
			gone = append(gone, id)
		}
	}
	m.mu.Unlock()
	if len(gone) > 0 {
		m.log.Warn("sidecars gone silent; their partitions move", zap.Strings("ids", gone))
		m.signal()
	}
}

func (m *Members) signal() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Owner returns the member that owns partition p: the one with the highest
// hash of (member, p). A member's arrival or departure moves only the
// partitions it wins or held, about 1/len(members) of them.
func Owner(p int, members []string) string {
	best, bestW := "", uint64(0)
	for _, m := range members {
		h := fnv.New64a()
		h.Write([]byte(m))
		h.Write([]byte{byte(p), byte(p >> 8), byte(p >> 16)})
		if w := mix(h.Sum64()); best == "" || w > bestW {
			best, bestW = m, w
		}
	}
	return best
}

// mix spreads FNV's output, whose high bits vary little between keys that
// differ in their last bytes (splitmix64's finalizer).
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
