// Package fleet keeps the set of live sidecars of a fleet and divides the
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
	"encoding/json"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// DefaultSubject is the subject sidecars announce themselves on.
const DefaultSubject = "hotcount.fleet"

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

// Fleet is this sidecar's view of the live sidecars. Its methods are safe
// for concurrent use; Leave stops it.
type Fleet struct {
	nc       *nats.Conn
	subject  string
	self     announcement
	interval time.Duration
	log      *zap.Logger
	sub      *nats.Subscription
	changed  chan struct{}
	stop     chan struct{}
	done     chan struct{}
	started  time.Time
	leave    sync.Once

	mu    sync.Mutex
	seen  map[string]time.Time // id → last announcement
	heard time.Time            // when this sidecar last heard its own announcement
}

// Join announces the sidecar id, of scope, on subject every interval, and
// tracks the other sidecars of the same scope. Leave undoes it.
func Join(nc *nats.Conn, subject, id, scope string, interval time.Duration, log *zap.Logger) (*Fleet, error) {
	f := &Fleet{
		nc: nc, subject: subject, interval: interval, log: log.Named("fleet"),
		self:    announcement{ID: id, Scope: scope},
		changed: make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		started: time.Now(),
		seen:    map[string]time.Time{id: time.Now()},
		heard:   time.Now(),
	}
	sub, err := nc.Subscribe(subject, f.receive)
	if err != nil {
		return nil, err
	}
	f.sub = sub
	f.announce(false)
	go f.run()
	return f, nil
}

// Settled says whether the sidecar has listened long enough to have heard
// every live sidecar at least once: before that, it should not claim
// partitions the others still own.
func (f *Fleet) Settled() bool { return time.Since(f.started) > f.interval*3/2 }

// Members returns the live sidecars' ids, sorted, this one included.
func (f *Fleet) Members() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.seen))
	for id := range f.seen {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Changed receives a value when the set of members changes.
func (f *Fleet) Changed() <-chan struct{} { return f.changed }

// Owned returns the partitions of 0..n-1 this sidecar owns in its view.
func (f *Fleet) Owned(n int) []int {
	members := f.Members()
	var out []int
	for p := range n {
		if Owner(p, members) == f.self.ID {
			out = append(out, p)
		}
	}
	return out
}

// Leave tells the others this sidecar is gone, so that they take its
// partitions at once rather than after Expiry intervals, and stops. Only
// the first call does anything.
func (f *Fleet) Leave() {
	f.leave.Do(func() {
		close(f.stop)
		<-f.done
		f.sub.Unsubscribe() //nolint:errcheck // the connection closes next
		f.announce(true)
		f.nc.Flush() //nolint:errcheck // best effort: the others expire it anyway
	})
}

func (f *Fleet) run() {
	defer close(f.done)
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		f.announce(false)
		f.expire()
	}
}

func (f *Fleet) announce(leaving bool) {
	a := f.self
	a.Leaving = leaving
	b, _ := json.Marshal(a)
	if err := f.nc.Publish(f.subject, b); err != nil {
		f.log.Warn("announce", zap.Error(err))
	}
}

func (f *Fleet) receive(m *nats.Msg) {
	var a announcement
	if err := json.Unmarshal(m.Data, &a); err != nil || a.ID == "" || a.Scope != f.self.Scope {
		return // not one of this fleet's sidecars
	}
	if a.ID == f.self.ID {
		f.mu.Lock()
		f.heard = time.Now() // the subject carries this sidecar's voice: it hears the others too
		f.mu.Unlock()
		return
	}
	f.mu.Lock()
	_, known := f.seen[a.ID]
	if a.Leaving {
		delete(f.seen, a.ID)
	} else {
		f.seen[a.ID] = time.Now()
	}
	f.mu.Unlock()
	switch {
	case a.Leaving && known:
		f.log.Info("sidecar left", zap.String("id", a.ID))
		f.signal()
	case !a.Leaving && !known:
		f.log.Info("sidecar joined", zap.String("id", a.ID))
		f.signal()
	}
}

// expire forgets the sidecars not heard from for Expiry intervals of this
// sidecar hearing itself. Time alone is not enough: a sidecar cut off (a
// lost NATS connection, a long pause) hears nobody, itself included, and
// forgetting the others would have it claim every partition; measured
// against its own voice, its view stays as it was until it hears again.
func (f *Fleet) expire() {
	f.mu.Lock()
	var gone []string
	for id, at := range f.seen {
		if id != f.self.ID && f.heard.Sub(at) > Expiry*f.interval {
			delete(f.seen, id)
			gone = append(gone, id)
		}
	}
	f.mu.Unlock()
	if len(gone) > 0 {
		f.log.Warn("sidecars gone silent; their partitions move", zap.Strings("ids", gone))
		f.signal()
	}
}

func (f *Fleet) signal() {
	select {
	case f.changed <- struct{}{}:
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
