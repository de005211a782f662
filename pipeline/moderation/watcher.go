package moderation

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/internal/waits"
	"github.com/hotcount/hotcount/pipeline/trend"
)

// Watcher bounds.
const (
	// notesQueue bounds the waiting topics queued for writing: one full
	// list's worth (trend's limit is at most 100). Past it a topic is
	// not queued (counted); the next answer that would list it queues it
	// again.
	notesQueue = 100
	// writeTimeout bounds one write of a waiting entry.
	writeTimeout = 5 * time.Second
)

// Watcher is one sidecar's copy of the fleet's moderation: Run keeps it
// by watching the bucket, and Screen applies it to each trending answer
// (trend.Moderation). Under review it also records, once for the fleet,
// the topics waiting for review. NewWatcher starts nothing; Load, if
// called, must return before Run starts. Screen is safe for concurrent
// use with everything.
type Watcher struct {
	js     jetstream.JetStream
	cfg    Config
	review bool
	log    *zap.Logger
	now    func() time.Time
	m      metrics

	// b is the bucket: opened by Load, or else by Run, before anything
	// else of Run's uses it.
	b *Bucket

	mu   sync.RWMutex
	read bool // the bucket has been read whole once: the copy holds
	cur  *state

	// notes are the waiting topics for Run to write; queued the topics
	// in notes or being written, so that each is queued once.
	notes  chan trend.Entry
	qmu    sync.Mutex
	queued map[string]bool
	// maxWaiting is MaxWaiting (a test's own, smaller).
	maxWaiting int
}

type metrics struct {
	moderated  *prometheus.GaugeVec
	unrecorded prometheus.Counter
}

// NewWatcher returns the watcher of the bucket cfg names on js; with
// review on, a topic is listed only once allowed. It starts nothing.
func NewWatcher(js jetstream.JetStream, cfg Config, review bool, reg prometheus.Registerer, log *zap.Logger, now func() time.Time) *Watcher {
	w := &Watcher{
		js: js, cfg: cfg, review: review, log: log.Named("moderation"), now: now,
		cur:        newState(),
		notes:      make(chan trend.Entry, notesQueue),
		queued:     make(map[string]bool),
		maxWaiting: MaxWaiting,
		m: metrics{
			moderated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "hotcount_trending_moderated",
				Help: "Topics moderated on the trending list as this sidecar last read them, by state: hidden, allowed (both decided by an operator), waiting (for review, --trending-review).",
			}, []string{"state"}),
			unrecorded: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "hotcount_trending_waiting_unrecorded_total",
				Help: "Topics waiting for review that this sidecar could not record in the bucket (its queue full, or the write failed); the next answer that would list one tries again.",
			}),
		},
	}
	reg.MustRegister(w.m.moderated, w.m.unrecorded)
	w.gauge(w.cur)
	return w
}

// Load opens the bucket and reads it whole once, so that the first
// answers are screened. ErrUnavailable says the server cannot keep it;
// any error leaves Run to try again.
func (w *Watcher) Load(ctx context.Context) error {
	b, err := Open(ctx, w.js, w.cfg)
	if err != nil {
		return err
	}
	w.b = b
	read, err := w.watchOnce(ctx, true)
	if err == nil && !read {
		err = fmt.Errorf("moderation: bucket %s not read: %w", w.cfg.Bucket, ctx.Err())
	}
	return err
}

// Run keeps the copy until ctx ends: it opens the bucket if Load did not,
// then watches it, watching again whenever a watch ends early (waits.Watch
// between), and writes the waiting topics Screen notes. It returns nil
// when ctx ends: a sidecar's trending answers go on, screened by the last
// copy read, whatever NATS does.
func (w *Watcher) Run(ctx context.Context) error {
	if w.b == nil {
		b, err := backoff.Retry(ctx, func() (*Bucket, error) {
			b, err := Open(ctx, w.js, w.cfg)
			if err != nil && (ctx.Err() != nil || w.closed()) {
				return nil, backoff.Permanent(err)
			}
			return b, err
		}, backoff.WithBackOff(waits.Reconnect()), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, wait time.Duration) {
			w.log.Warn("trending moderation: cannot open its bucket; trying again", zap.String("bucket", w.cfg.Bucket), zap.Error(err), zap.Duration("in", wait))
		}))
		if err != nil {
			return nil // ctx ended
		}
		w.b = b
	}
	var wg sync.WaitGroup
	wg.Go(func() { w.record(ctx) })
	w.watch(ctx)
	wg.Wait()
	return nil
}

// closed says whether the NATS connection is closed for good.
func (w *Watcher) closed() bool { return w.js.Conn().IsClosed() }

// watch runs watches until ctx ends or the connection closes: after one
// ends early, another after waits.Watch's wait, from its first again once
// a watch had read the bucket.
func (w *Watcher) watch(ctx context.Context) {
	b := waits.Watch()
	backoff.Retry(ctx, func() (struct{}, error) { //nolint:errcheck // it ends with ctx alone
		read, err := w.watchOnce(ctx, false)
		if ctx.Err() != nil || w.closed() {
			// The sidecar's shutdown closes NATS before the services
			// stop: a closed connection never comes back, and the last
			// copy screens the answers until the listeners stop.
			return struct{}{}, nil
		}
		if read {
			b.Reset()
		}
		if err == nil {
			err = errors.New("moderation: watch ended")
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, wait time.Duration) {
		w.log.Warn("trending moderation: watch ended; the last copy read screens the list until it is read again", zap.Error(err), zap.Duration("in", wait))
	}))
}

// watchOnce runs one watch until it or ctx ends (with untilRead, until
// the bucket is read whole), and says whether it read the bucket whole. A
// new reading replaces the copy once complete; until then the last one
// screens.
func (w *Watcher) watchOnce(ctx context.Context, untilRead bool) (read bool, err error) {
	wt, err := w.b.kv.WatchAll(ctx)
	if err != nil {
		return false, fmt.Errorf("moderation: watch %s: %w", w.cfg.Bucket, err)
	}
	defer stopWatch(wt)
	// The watch's consumer finds out on its own that the server restarted
	// only after missing its heartbeats (20 s and more); a change made
	// meanwhile would wait that long. A reconnection ends the watch: the
	// next one reads the bucket again.
	nc := w.js.Conn()
	reconnected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(reconnected)
	next := newState() // the reading under way
	for {
		select {
		case <-ctx.Done():
			return read, nil
		case <-reconnected:
			return read, errors.New("moderation: NATS reconnected: watching again")
		case e, ok := <-wt.Updates():
			switch {
			case !ok:
				return read, errors.New("moderation: watch closed")
			case e == nil: // every entry there when the watch began is read
				w.swap(next)
				next, read = nil, true
				if untilRead {
					return true, nil
				}
			case next != nil:
				if c, ok := next.apply(e); ok && c.bad != nil {
					w.log.Warn("trending moderation: unreadable entry left out", zap.String("key", e.Key()), zap.Error(c.bad))
				}
			default:
				w.mu.Lock()
				c, ok := w.cur.apply(e)
				w.gauge(w.cur)
				w.mu.Unlock()
				if ok {
					w.logChange(c, e.Key())
				}
			}
		}
	}
}

// swap makes next the copy, logging each decision it changes: an
// operator's change made while no watch ran is logged as it is applied.
// The first reading is logged as a summary.
func (w *Watcher) swap(next *state) {
	w.mu.Lock()
	prev, first := w.cur, !w.read
	w.cur, w.read = next, true
	w.gauge(next)
	w.mu.Unlock()
	if first {
		var hidden, allowed int
		for _, d := range next.decided {
			if d.State == Hidden {
				hidden++
			} else {
				allowed++
			}
		}
		w.log.Info("trending moderation read", zap.String("bucket", w.cfg.Bucket), zap.Bool("review", w.review),
			zap.Int("hidden", hidden), zap.Int("allowed", allowed), zap.Int("waiting", len(next.waiting)))
		return
	}
	for t, d := range next.decided {
		if was, ok := prev.decided[t]; !ok || !same(was, d) {
			w.logChange(change{kind: decisionPrefix, topic: t, decision: d}, decisionKey(t))
		}
	}
	for t := range prev.decided {
		if _, ok := next.decided[t]; !ok {
			w.logChange(change{kind: decisionPrefix, topic: t, decision: Decision{Topic: t, State: Cleared}}, decisionKey(t))
		}
	}
}

// same says whether a and b are one decision.
func same(a, b Decision) bool {
	return a.State == b.State && a.By == b.By && a.At.Equal(b.At) && a.Reason == b.Reason
}

// logChange is the audit of a change applied: every sidecar logs each
// operator's decision at Info; waiting entries, which sidecars write
// themselves, at Debug.
func (w *Watcher) logChange(c change, key string) {
	switch {
	case c.bad != nil:
		w.log.Warn("trending moderation: unreadable entry left out", zap.String("key", key), zap.Error(c.bad))
	case c.kind == decisionPrefix:
		w.log.Info("trending moderation applied", zap.String("topic", c.topic), zap.String("state", string(c.decision.State)),
			zap.String("by", c.decision.By), zap.Time("at", c.decision.At), zap.String("reason", c.decision.Reason))
	default:
		w.log.Debug("trending moderation: waiting list changed", zap.String("topic", c.topic))
	}
}

// gauge sets the gauges from s; the caller holds mu.
func (w *Watcher) gauge(s *state) {
	var hidden, allowed float64
	for _, d := range s.decided {
		if d.State == Hidden {
			hidden++
		} else {
			allowed++
		}
	}
	w.m.moderated.WithLabelValues(string(Hidden)).Set(hidden)
	w.m.moderated.WithLabelValues(string(Allowed)).Set(allowed)
	w.m.moderated.WithLabelValues("waiting").Set(float64(len(s.waiting)))
}

// Verdict implements trend.Moderation: whether topic is hidden, or held
// for review (under review, not allowed) as the bucket was last read.
func (w *Watcher) Verdict(topic string) (hidden, held bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.verdict(topic)
}

// verdict is Verdict under w.mu.
func (w *Watcher) verdict(topic string) (hidden, held bool) {
	d, decided := w.cur.decided[topic]
	return decided && d.State == Hidden, w.review && !decided
}

// Screen implements trend.Moderation: of ranked (highest first), the first
// limit that may be listed, in order. Hidden topics never are; under
// review only allowed ones are, and each that would have been in the list
// without review is noted as waiting (written to the bucket by Run, once
// for the fleet). Before the bucket has been read whole, nothing is
// hidden (the server may have no JetStream; the sidecar warned at start)
// and, under review, nothing is allowed. It does not change ranked, a
// cached answer's.
func (w *Watcher) Screen(ranked []trend.Entry, limit int) []trend.Entry {
	out := make([]trend.Entry, 0, min(limit, len(ranked)))
	var wait []trend.Entry
	w.mu.RLock()
	unhidden := 0 // entries so far that the list without review would hold
	for _, e := range ranked {
		if len(out) == limit {
			break
		}
		switch hidden, held := w.verdict(e.Topic); {
		case hidden:
			continue
		case held:
			if _, known := w.cur.waiting[e.Topic]; !known && w.read && unhidden < limit {
				wait = append(wait, e)
			}
			unhidden++
			continue
		}
		unhidden++
		out = append(out, e)
	}
	w.mu.RUnlock()
	for _, e := range wait {
		w.note(e)
	}
	return out
}

// MaxWaiting bounds the topics waiting for review: anyone who may read
// /v1/trending picks the window and limit that note them, and each
// waiting entry is held by every sidecar and read at each start. Past it
// a topic is not recorded (counted) until operators allow, hide or let
// entries expire (a day).
const MaxWaiting = 1000

// note queues e's topic for Run to record as waiting, unless it is queued
// already; a full queue, or MaxWaiting topics waiting, drops it (counted).
func (w *Watcher) note(e trend.Entry) {
	// Both locks (mu, then qmu, as nowhere else takes both): record adds a
	// topic it wrote to waiting before it takes it out of queued, and a
	// topic in both is one topic. Counted twice, it filled the bound a
	// topic early (TestWaitingIsBounded, under load).
	w.mu.RLock()
	defer w.mu.RUnlock()
	w.qmu.Lock()
	defer w.qmu.Unlock()
	if _, ok := w.cur.waiting[e.Topic]; ok || w.queued[e.Topic] {
		return // recorded, or about to be
	}
	n := len(w.cur.waiting)
	for topic := range w.queued { // at most notesQueue
		if _, ok := w.cur.waiting[topic]; !ok {
			n++
		}
	}
	if n >= w.maxWaiting {
		w.m.unrecorded.Inc()
		return
	}
	select {
	case w.notes <- e:
		w.queued[e.Topic] = true
	default:
		w.m.unrecorded.Inc()
	}
}

// record writes the noted waiting topics until ctx ends: each with
// Create, so that of a fleet that finds it at once the first writes it
// and the others find it there, with the per-key TTL that bounds the
// waiting list.
func (w *Watcher) record(ctx context.Context) {
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-w.notes:
			wt := Waiting{Topic: e.Topic, FirstSeen: w.now().UTC(), Score: e.Score, Count: e.Count}
			err := w.b.wait(ctx, wt)
			if err == nil || errors.Is(err, jetstream.ErrKeyExists) {
				// Known from now on, before the watch brings it back:
				// the next answers do not queue it again.
				w.mu.Lock()
				if _, ok := w.cur.waiting[e.Topic]; !ok {
					w.cur.waiting[e.Topic] = wt
					w.gauge(w.cur)
				}
				w.mu.Unlock()
				failing = false
			} else if ctx.Err() == nil && !w.closed() {
				w.m.unrecorded.Inc()
				if !failing { // once per run of failures: the next answers try again
					w.log.Warn("trending moderation: cannot record a topic waiting for review", zap.String("topic", e.Topic), zap.Error(err))
				}
				failing = true
			}
			w.qmu.Lock()
			delete(w.queued, e.Topic)
			w.qmu.Unlock()
		}
	}
}

// wait creates w's waiting entry, with the bucket's waiting TTL;
// jetstream.ErrKeyExists says it is there already.
func (b *Bucket) wait(ctx context.Context, w Waiting) error {
	if err := CheckTopic(w.Topic); err != nil {
		return err
	}
	v, err := json.Marshal(w)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	_, err = b.kv.Create(ctx, waitingKey(w.Topic), v, jetstream.KeyTTL(b.cfg.waitingTTL()))
	return err
}

func sortDecisions(ds []Decision) {
	slices.SortFunc(ds, func(a, b Decision) int { return cmp.Compare(a.Topic, b.Topic) })
}

func sortWaiting(ws []Waiting) {
	slices.SortFunc(ws, func(a, b Waiting) int {
		if c := a.FirstSeen.Compare(b.FirstSeen); c != 0 {
			return c
		}
		return cmp.Compare(a.Topic, b.Topic)
	})
}
