// Package moderation is the operators' say over the trending list: topics
// hidden from it, topics allowed onto it when the fleet runs with review
// (--trending-review, where a topic trends only once allowed), and the
// topics waiting for that review. It only screens the list: a hidden
// topic's mentions are counted like any other's.
//
// The state is the fleet's, in one JetStream key-value bucket
// (--trending-bucket): `hotcount trending` writes the decisions through a
// Bucket, and every sidecar's Watcher watches the bucket and screens its
// trending answers with what it holds, so a change shows on every sidecar
// at its next answer.
//
// Keys are a kind and the topic in unpadded URL-safe base64 (a topic is
// any UTF-8, a key only [-_=./A-Za-z0-9]):
//
//	topic.<b64>    a decision (Decision, JSON): hidden, allowed, or cleared
//	waiting.<b64>  a topic waiting for review (Waiting, JSON), with a
//	               per-key TTL (Config.WaitingTTL), written once by the
//	               first sidecar that would have listed it
package moderation

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/schema"
)

// Defaults.
const (
	// DefaultBucket is the key-value bucket of the fleet's moderation,
	// named like the other bucket hotcount keeps (hotcount_checkpoints).
	DefaultBucket = "hotcount_trending"
	// DefaultWaitingTTL is how long a topic waits for review before its
	// entry expires: the waiting list holds the day's candidates, not
	// every topic that ever wanted to trend. One still trending is
	// written again by the next answer that would list it.
	DefaultWaitingTTL = 24 * time.Hour
	// MaxTopicBytes is the longest topic moderated: --max-topic-bytes'
	// upper bound, so that a key (its base64, 4/3 as long) stays far
	// inside NATS's 4 KiB control line.
	MaxTopicBytes = 1024
	// markerTTL is how long the bucket keeps the marker of a waiting
	// entry that expired or was removed: long enough for a watch that
	// lost its server for a while to see it; a watch that starts later
	// reads the bucket whole and never needs it. The server raises a
	// shorter per-key TTL to it (with history kept): it must not be
	// longer than the waiting TTL.
	markerTTL = time.Hour
	// history is how many decisions the bucket keeps per topic: the
	// latest is the one that counts, the ones before it are there for
	// `nats kv history` when someone asks who decided what before.
	history = 10
)

// State is an operator's decision about a topic.
type State string

// The decisions.
const (
	// Hidden: never listed, review or not.
	Hidden State = "hidden"
	// Allowed: listed under review (--trending-review); without review
	// every topic that is not hidden may be listed anyway.
	Allowed State = "allowed"
	// Cleared: no decision any more (`unhide`): listed like any topic,
	// or under review waiting again. Kept, rather than the key deleted,
	// so that every sidecar can log who cleared it.
	Cleared State = "cleared"
)

// Decision is an operator's decision about a topic: the value of its key.
type Decision struct {
	Topic string `json:"topic"`
	State State  `json:"state"`
	// By is the operator who decided (--by, or $USER).
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// Waiting is a topic that would have been listed but for review: the
// value of its waiting key, as the first sidecar that found it wrote it.
type Waiting struct {
	Topic     string    `json:"topic"`
	FirstSeen time.Time `json:"firstSeen"`
	// Score and Count are the topic's in the list it would have been in.
	Score float64 `json:"score"`
	Count int64   `json:"count"`
}

// Config is where the moderation is kept.
type Config struct {
	// Bucket is the key-value bucket (DefaultBucket).
	Bucket string
	// Replicas is the bucket's replication when Open creates it (0: 1);
	// an existing bucket is used as it is.
	Replicas int
	// WaitingTTL is how long a waiting entry lasts (0: DefaultWaitingTTL).
	WaitingTTL time.Duration
	// Existing binds only a bucket that exists: the operators' commands,
	// whose decision in a bucket no sidecar watches (a wrong --nats-url or
	// --trending-bucket) would change nothing while saying it did.
	Existing bool
}

func (c Config) waitingTTL() time.Duration {
	if c.WaitingTTL > 0 {
		return c.WaitingTTL
	}
	return DefaultWaitingTTL
}

// markerTTL is the bucket's limit marker TTL: markerTTL, or the waiting
// TTL if shorter, since the server raises a shorter per-key TTL to it.
func (c Config) markerTTL() time.Duration { return max(min(markerTTL, c.waitingTTL()), time.Second) }

// Errors callers branch on.
var (
	// ErrUnavailable says the NATS server cannot keep the moderation: it
	// has no JetStream, or one without per-message TTLs (before 2.11).
	ErrUnavailable = errors.New("moderation: the NATS server has no JetStream with per-message TTLs (nats-server 2.11 or later with JetStream on): trending moderation keeps its state in a JetStream key-value bucket")
	// ErrBadTopic is a topic that cannot be moderated (schema.ValidateTopic).
	ErrBadTopic = errors.New("moderation: bad topic")
)

// Bucket is the fleet's moderation as the operators change it. It is safe
// for concurrent use.
type Bucket struct {
	kv  jetstream.KeyValue
	cfg Config
}

// Open binds the bucket, creating it if absent. An existing bucket is
// used as it is (its replicas may have been raised since), but it must
// allow per-key TTLs. ErrUnavailable says the server cannot keep it.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Bucket, error) {
	info, err := js.AccountInfo(ctx)
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	case err != nil:
		return nil, fmt.Errorf("moderation: bucket %s: %w", cfg.Bucket, err)
	case info.API.Level < 1: // per-message TTLs came with API level 1 (2.11)
		return nil, fmt.Errorf("%w: its JetStream API level is %d", ErrUnavailable, info.API.Level)
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) && cfg.Existing {
		return nil, fmt.Errorf("moderation: no bucket %s on this server: the sidecars make it when they start with minute buckets on (--windows 1m); check --nats-url and --trending-bucket against theirs", cfg.Bucket)
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:         cfg.Bucket,
			Description:    "hotcount: topics hidden from or allowed onto the trending list, and those waiting for review",
			History:        history,
			Storage:        jetstream.FileStorage,
			Replicas:       max(cfg.Replicas, 1),
			LimitMarkerTTL: cfg.markerTTL(),
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket) // another process created it meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("moderation: bucket %s: %w", cfg.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("moderation: bucket %s: %w", cfg.Bucket, err)
	}
	if kvs, ok := st.(*jetstream.KeyValueBucketStatus); ok && kvs.LimitMarkerTTL() == 0 {
		return nil, fmt.Errorf("moderation: bucket %s has no per-key TTLs (created outside hotcount?): delete it, or give it a limit marker TTL (nats stream edit KV_%s --marker-ttl 1h)", cfg.Bucket, cfg.Bucket)
	}
	return &Bucket{kv: kv, cfg: cfg}, nil
}

// Key kinds.
const (
	decisionPrefix = "topic."
	waitingPrefix  = "waiting."
)

func decisionKey(topic string) string {
	return decisionPrefix + base64.RawURLEncoding.EncodeToString([]byte(topic))
}

func waitingKey(topic string) string {
	return waitingPrefix + base64.RawURLEncoding.EncodeToString([]byte(topic))
}

// parseKey returns a key's kind (decisionPrefix or waitingPrefix) and
// topic; ok is false for a key of neither kind.
func parseKey(key string) (kind, topic string, ok bool) {
	for _, p := range []string{decisionPrefix, waitingPrefix} {
		if rest, found := strings.CutPrefix(key, p); found {
			b, err := base64.RawURLEncoding.DecodeString(rest)
			if err != nil {
				return "", "", false
			}
			return p, string(b), true
		}
	}
	return "", "", false
}

// CheckTopic says whether topic can be moderated.
func CheckTopic(topic string) error {
	if err := schema.ValidateTopic(topic, MaxTopicBytes); err != nil {
		return fmt.Errorf("%w: %w", ErrBadTopic, err)
	}
	return nil
}

// Hide takes topic off the trending list, review or not, and out of the
// waiting list. It replaces any earlier decision.
func (b *Bucket) Hide(ctx context.Context, topic, by, reason string, now time.Time) (Decision, error) {
	return b.decide(ctx, Decision{Topic: topic, State: Hidden, By: by, At: now.UTC(), Reason: reason})
}

// Allow lets topic onto the trending list under review, and takes it out
// of the waiting list. It replaces any earlier decision: allowing a
// hidden topic unhides it.
func (b *Bucket) Allow(ctx context.Context, topic, by, reason string, now time.Time) (Decision, error) {
	return b.decide(ctx, Decision{Topic: topic, State: Allowed, By: by, At: now.UTC(), Reason: reason})
}

// decide records d, then removes the topic's waiting entry, which a
// decision settles.
func (b *Bucket) decide(ctx context.Context, d Decision) (Decision, error) {
	if err := CheckTopic(d.Topic); err != nil {
		return Decision{}, err
	}
	v, err := json.Marshal(d)
	if err != nil {
		return Decision{}, err
	}
	if _, err := b.kv.Put(ctx, decisionKey(d.Topic), v); err != nil {
		return Decision{}, fmt.Errorf("moderation: %s %q: %w", d.State, d.Topic, err)
	}
	// Purged rather than deleted: no history of it is kept, and its
	// marker goes after markerTTL, so allowed topics leave nothing behind;
	// and only when there, or every decision would leave a marker. One
	// left behind (written meanwhile, or this failing) does no harm:
	// every sidecar ignores the waiting entry of a decided topic, and it
	// expires.
	key := waitingKey(d.Topic)
	_, err = b.kv.Get(ctx, key)
	if err == nil {
		err = b.kv.Purge(ctx, key, jetstream.PurgeTTL(b.cfg.markerTTL()))
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return d, fmt.Errorf("moderation: %s %q: recorded, but its waiting entry is left (it expires): %w", d.State, d.Topic, err)
	}
	return d, nil
}

// Unhide clears topic's decision if it is hidden: it may trend again (or
// under review, wait again). It returns the decision it cleared; changed
// is false, and nothing is written, when topic was not hidden (an allowed
// topic stays allowed: hiding it is how an allowance is taken back).
func (b *Bucket) Unhide(ctx context.Context, topic, by, reason string, now time.Time) (was Decision, changed bool, err error) {
	if err := CheckTopic(topic); err != nil {
		return Decision{}, false, err
	}
	key := decisionKey(topic)
	for range 3 { // a decision changed between the read and the write: read again
		e, err := b.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Decision{}, false, nil
		}
		if err != nil {
			return Decision{}, false, fmt.Errorf("moderation: unhide %q: %w", topic, err)
		}
		if json.Unmarshal(e.Value(), &was) != nil || was.State != Hidden {
			return was, false, nil
		}
		v, err := json.Marshal(Decision{Topic: topic, State: Cleared, By: by, At: now.UTC(), Reason: reason})
		if err != nil {
			return Decision{}, false, err
		}
		_, err = b.kv.Update(ctx, key, v, e.Revision())
		if err == nil {
			return was, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return Decision{}, false, fmt.Errorf("moderation: unhide %q: %w", topic, err)
		}
	}
	return Decision{}, false, fmt.Errorf("moderation: unhide %q: its decision kept changing while this ran: try again", topic)
}

// List is the moderation as the bucket holds it.
type List struct {
	// Decisions are the hidden and allowed topics, by topic.
	Decisions []Decision `json:"decisions"`
	// Waiting are the topics waiting for review (none decided), oldest
	// first.
	Waiting []Waiting `json:"waiting"`
}

// stopWatch ends a watch. nats.go's callback may be blocked handing the
// watch an update it will never take (its channel holds 256): what is
// left is drained, or that goroutine would stay forever.
func stopWatch(w jetstream.KeyWatcher) {
	w.Stop() //nolint:errcheck // the watch's end
	go func() {
		for range w.Updates() { //nolint:revive // drained, not read
		}
	}()
}

// List reads the bucket whole.
func (b *Bucket) List(ctx context.Context) (List, error) {
	w, err := b.kv.WatchAll(ctx)
	if err != nil {
		return List{}, fmt.Errorf("moderation: list: %w", err)
	}
	defer stopWatch(w)
	s := newState()
	for {
		select {
		case <-ctx.Done():
			return List{}, fmt.Errorf("moderation: list: %w", ctx.Err())
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return List{}, errors.New("moderation: list: the watch ended before the bucket was read")
			case e != nil:
				s.apply(e)
				continue
			}
			return s.list(), nil // nil: every entry there is read
		}
	}
}

// state is what the bucket holds, as read.
type state struct {
	decided map[string]Decision // hidden or allowed
	waiting map[string]Waiting
}

func newState() *state {
	return &state{decided: make(map[string]Decision), waiting: make(map[string]Waiting)}
}

// change is one entry of the bucket applied to a state.
type change struct {
	kind     string // decisionPrefix or waitingPrefix
	topic    string
	decision Decision // a decision's new value (State Cleared when removed)
	bad      error    // the entry could not be read: it is left out
}

// apply puts one entry of the bucket into s and says what it changed; ok
// is false for a key that is none of this package's.
func (s *state) apply(e jetstream.KeyValueEntry) (c change, ok bool) {
	kind, topic, ok := parseKey(e.Key())
	if !ok {
		return change{}, false
	}
	c = change{kind: kind, topic: topic, decision: Decision{Topic: topic, State: Cleared}}
	put := e.Operation() == jetstream.KeyValuePut
	switch kind {
	case decisionPrefix:
		delete(s.decided, topic)
		if !put {
			return c, true // deleted by hand (nats kv del): no decision
		}
		var d Decision
		if err := json.Unmarshal(e.Value(), &d); err != nil {
			c.bad = err
			return c, true
		}
		d.Topic = topic // the key says whose it is
		c.decision = d
		if d.State == Hidden || d.State == Allowed {
			s.decided[topic] = d
		}
	case waitingPrefix:
		delete(s.waiting, topic)
		if !put {
			return c, true // expired, or settled by a decision
		}
		var w Waiting
		if err := json.Unmarshal(e.Value(), &w); err != nil {
			c.bad = err
			return c, true
		}
		w.Topic = topic
		s.waiting[topic] = w
	}
	return c, true
}

// list is s for people: decisions by topic, waiting topics that no
// decision has settled yet, oldest first.
func (s *state) list() List {
	l := List{Decisions: []Decision{}, Waiting: []Waiting{}}
	for _, d := range s.decided {
		l.Decisions = append(l.Decisions, d)
	}
	for t, w := range s.waiting {
		if _, decided := s.decided[t]; !decided {
			l.Waiting = append(l.Waiting, w)
		}
	}
	sortDecisions(l.Decisions)
	sortWaiting(l.Waiting)
	return l
}
