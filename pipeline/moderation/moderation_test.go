package moderation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/pipeline/trend"
	"github.com/hotcount/hotcount/schema"
)

// js is a JetStream context on a connection of its own to url.
func js(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	j, err := jetstream.New(testenv.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// openBucket is the operators' side of the bucket, on a connection of its
// own.
func openBucket(t *testing.T, url string, cfg Config) *Bucket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := Open(ctx, js(t, url), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// running is a watcher on a connection of its own, loaded and running
// until the test ends; its log is kept.
type running struct {
	*Watcher
	logs *observer.ObservedLogs
	reg  *prometheus.Registry
}

func startWatcher(t *testing.T, url string, cfg Config, review bool) running {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	reg := prometheus.NewRegistry()
	w := NewWatcher(js(t, url), cfg, review, reg, zap.New(core), time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	defer lcancel()
	if err := w.Load(lctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run still running 10s after its context ended")
		}
	})
	return running{Watcher: w, logs: logs, reg: reg}
}

// entries is a ranked list of topics, highest first.
func entries(topics ...string) []trend.Entry {
	out := make([]trend.Entry, len(topics))
	for i, tp := range topics {
		out[i] = trend.Entry{Topic: tp, Count: int64(100 * (len(topics) - i)), Score: float64(10 * (len(topics) - i))}
	}
	return out
}

func names(es []trend.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Topic)
	}
	return out
}

// screened polls until w screens ranked to want.
func screened(t *testing.T, w *Watcher, ranked []trend.Entry, limit int, want ...string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		if got := names(w.Screen(ranked, limit)); !slices.Equal(got, want) {
			return fmt.Errorf("screened %v, want %v", got, want)
		}
		return nil
	})
}

// applied says whether the watcher logged a decision on topic at Info
// with these fields.
func applied(logs *observer.ObservedLogs, topic string, state State, by, reason string) bool {
	for _, e := range logs.FilterMessage("trending moderation applied").All() {
		f := e.ContextMap()
		if e.Level == zapcore.InfoLevel && f["topic"] == topic && f["state"] == string(state) && f["by"] == by && f["reason"] == reason {
			return true
		}
	}
	return false
}

// TestHideReachesAnotherWatcher: an operator's hide, on a connection of
// its own, reaches a sidecar's watcher on another: the topic leaves its
// screened list (which still fills to its limit from the ranks below),
// and the watcher logs who hid it and why. Unhide brings it back, also
// logged; unhiding a topic that is not hidden changes nothing.
func TestHideReachesAnotherWatcher(t *testing.T) {
	srv := testenv.NATS(t)
	cfg := Config{Bucket: "trending_test"}
	w := startWatcher(t, srv.ClientURL(), cfg, false)
	b := openBucket(t, srv.ClientURL(), cfg)
	ctx := context.Background()
	ranked := entries("bots", "golang", "nats", "rust")

	screened(t, w.Watcher, ranked, 3, "bots", "golang", "nats")
	// The topic is any UTF-8: a dot, a space, a slash and a non-Latin
	// script make no key of their own.
	odd := "bots.ai / 机器人"
	for _, topic := range []string{"bots", odd} {
		if _, err := b.Hide(ctx, topic, "alice", "bot-made", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	screened(t, w.Watcher, ranked, 3, "golang", "nats", "rust")
	screened(t, w.Watcher, entries(odd, "golang"), 3, "golang")
	testenv.Eventually(t, 10*time.Second, func() error {
		if !applied(w.logs, "bots", Hidden, "alice", "bot-made") || !applied(w.logs, odd, Hidden, "alice", "bot-made") {
			return errors.New("the watcher has not logged both hides")
		}
		if n := testutil.ToFloat64(w.m.moderated.WithLabelValues("hidden")); n != 2 {
			return fmt.Errorf("hotcount_trending_moderated{state=hidden} %v, want 2", n)
		}
		return nil
	})

	was, changed, err := b.Unhide(ctx, "bots", "bob", "reviewed: real", time.Now())
	if err != nil || !changed || was.State != Hidden || was.By != "alice" {
		t.Fatalf("Unhide: %+v, changed %v, %v; want alice's hide cleared", was, changed, err)
	}
	screened(t, w.Watcher, ranked, 3, "bots", "golang", "nats")
	testenv.Eventually(t, 10*time.Second, func() error {
		if !applied(w.logs, "bots", Cleared, "bob", "reviewed: real") {
			return errors.New("the watcher has not logged bob's unhide")
		}
		return nil
	})
	if _, changed, err := b.Unhide(ctx, "bots", "bob", "", time.Now()); err != nil || changed {
		t.Errorf("unhide of a topic no longer hidden: changed %v, %v; want nothing done", changed, err)
	}
	if _, changed, err := b.Unhide(ctx, "never-moderated", "bob", "", time.Now()); err != nil || changed {
		t.Errorf("unhide of a topic never moderated: changed %v, %v; want nothing done", changed, err)
	}

	l, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Decisions) != 1 || l.Decisions[0].Topic != odd || l.Decisions[0].State != Hidden || l.Decisions[0].By != "alice" {
		t.Errorf("List: %+v, want the odd topic hidden by alice alone", l.Decisions)
	}

	// A watcher that starts now reads the bucket whole before its first
	// answer (Load): the hide holds on a restarted sidecar at once.
	w2 := startWatcher(t, srv.ClientURL(), cfg, false)
	if got := names(w2.Screen(entries(odd, "golang"), 3)); !slices.Equal(got, []string{"golang"}) {
		t.Errorf("a new watcher's first answer: %v, want the hidden topic left out", got)
	}
}

// TestReviewListsOnlyAllowedTopics: under review a topic is listed once an
// operator allowed it. The ones that would have been listed are recorded
// as waiting, once for the fleet though two sidecars found them, and
// listed for the operators with their score; allowing one lists it and
// takes it off the waiting list, hiding one takes it off too. A topic
// ranked below the list's limit does not wait.
func TestReviewListsOnlyAllowedTopics(t *testing.T) {
	srv := testenv.NATS(t)
	cfg := Config{Bucket: "trending_review"}
	w1 := startWatcher(t, srv.ClientURL(), cfg, true)
	w2 := startWatcher(t, srv.ClientURL(), cfg, true)
	b := openBucket(t, srv.ClientURL(), cfg)
	ctx := context.Background()
	ranked := entries("surge", "bots", "golang", "nats", "deep")

	// Both sidecars answer at once: each notes the three topics a list of
	// three would have shown, and the fleet records each once.
	var wg sync.WaitGroup
	for _, w := range []*Watcher{w1.Watcher, w2.Watcher} {
		wg.Go(func() {
			if got := w.Screen(ranked, 3); len(got) != 0 {
				t.Errorf("under review with nothing allowed: %v listed", names(got))
			}
		})
	}
	wg.Wait()
	var l List
	testenv.Eventually(t, 10*time.Second, func() error {
		var err error
		if l, err = b.List(ctx); err != nil {
			return err
		}
		var got []string
		for _, wt := range l.Waiting {
			got = append(got, wt.Topic)
		}
		slices.Sort(got)
		if want := []string{"bots", "golang", "surge"}; !slices.Equal(got, want) {
			return fmt.Errorf("waiting %v, want %v", got, want)
		}
		return nil
	})
	for _, wt := range l.Waiting {
		if wt.Topic == "surge" && (wt.Score != 50 || wt.Count != 500 || wt.FirstSeen.IsZero()) {
			t.Errorf("surge waits as %+v, want its score 50 and count 500 and when it was first seen", wt)
		}
		hist, err := b.kv.History(ctx, waitingKey(wt.Topic))
		if err != nil || len(hist) != 1 {
			t.Errorf("%s's waiting entry written %d times (%v), want once for the fleet", wt.Topic, len(hist), err)
		}
	}
	for _, w := range []running{w1, w2} {
		if n := testutil.ToFloat64(w.m.unrecorded); n != 0 {
			t.Errorf("%v waiting topics unrecorded", n)
		}
	}

	if _, err := b.Allow(ctx, "surge", "alice", "real news", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Hide(ctx, "bots", "alice", "", time.Now()); err != nil {
		t.Fatal(err)
	}
	// Each watcher has read both decisions (the hide is the later write)
	// before the answer that notes nats: an answer screened between the
	// two, with bots still held, leaves nats out of a list of three.
	for _, w := range []*Watcher{w1.Watcher, w2.Watcher} {
		testenv.Eventually(t, 10*time.Second, func() error {
			if hidden, _ := w.Verdict("bots"); !hidden {
				return errors.New("bots not hidden yet")
			}
			return nil
		})
		screened(t, w, ranked, 3, "surge")
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		var err error
		if l, err = b.List(ctx); err != nil {
			return err
		}
		// With bots hidden, nats moves into a list of three: it waits
		// now too.
		if len(l.Waiting) != 2 || l.Waiting[0].Topic != "golang" || l.Waiting[1].Topic != "nats" {
			return fmt.Errorf("waiting %+v, want golang, then nats", l.Waiting)
		}
		if len(l.Decisions) != 2 || l.Decisions[0].Topic != "bots" || l.Decisions[0].State != Hidden || l.Decisions[1].Topic != "surge" || l.Decisions[1].State != Allowed {
			return fmt.Errorf("decisions %+v, want bots hidden and surge allowed", l.Decisions)
		}
		return nil
	})
	// The allowed topic's waiting entry is gone from the bucket, not
	// just from the list.
	if _, err := b.kv.Get(ctx, waitingKey("surge")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("surge's waiting entry: %v, want it removed", err)
	}
	if _, err := b.kv.Get(ctx, waitingKey("deep")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("deep, ranked below the list, waits: %v", err)
	}
}

// TestWaitingExpires: a waiting entry lasts its TTL (a per-key TTL in the
// bucket): then every watcher and the list drop it, and a topic still
// trending is recorded again.
func TestWaitingExpires(t *testing.T) {
	srv := testenv.NATS(t)
	cfg := Config{Bucket: "trending_ttl", WaitingTTL: time.Second}
	w := startWatcher(t, srv.ClientURL(), cfg, true)
	b := openBucket(t, srv.ClientURL(), cfg)
	ctx := context.Background()
	waiting := func() float64 { return testutil.ToFloat64(w.m.moderated.WithLabelValues("waiting")) }

	w.Screen(entries("fad"), 1)
	testenv.Eventually(t, 10*time.Second, func() error {
		if waiting() != 1 {
			return errors.New("fad is not waiting yet")
		}
		return nil
	})
	first, err := b.kv.Get(ctx, waitingKey("fad"))
	if err != nil {
		t.Fatal(err)
	}
	// The watch sees the entry expire (the bucket's TTL marker).
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := waiting(); n != 0 {
			return fmt.Errorf("%v waiting, want the expired entry gone", n)
		}
		return nil
	})
	l, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Waiting) != 0 {
		t.Errorf("list after the TTL: %+v", l.Waiting)
	}
	w.Screen(entries("fad"), 1)
	testenv.Eventually(t, 10*time.Second, func() error {
		e, err := b.kv.Get(ctx, waitingKey("fad"))
		if err != nil {
			return err
		}
		if e.Revision() <= first.Revision() {
			return errors.New("fad not recorded again")
		}
		return nil
	})
}

// TestBadTopics: what cannot be a topic cannot be moderated, and says
// why.
func TestBadTopics(t *testing.T) {
	srv := testenv.NATS(t)
	b := openBucket(t, srv.ClientURL(), Config{Bucket: "trending_bad"})
	ctx := context.Background()
	for name, topic := range map[string]string{
		"empty":         "",
		"control":       "bad\ttopic",
		"not UTF-8":     "\xff\xfe",
		"over the max":  strings.Repeat("x", MaxTopicBytes+1),
		"newline in it": "two\nlines",
	} {
		t.Run(name, func(t *testing.T) {
			if err := CheckTopic(topic); !errors.Is(err, ErrBadTopic) {
				t.Errorf("CheckTopic: %v, want ErrBadTopic", err)
			}
			if _, err := b.Hide(ctx, topic, "alice", "", time.Now()); !errors.Is(err, ErrBadTopic) {
				t.Errorf("Hide: %v, want ErrBadTopic", err)
			}
			if _, _, err := b.Unhide(ctx, topic, "alice", "", time.Now()); !errors.Is(err, ErrBadTopic) {
				t.Errorf("Unhide: %v, want ErrBadTopic", err)
			}
			if _, err := b.Allow(ctx, topic, "alice", "", time.Now()); !errors.Is(err, ErrBadTopic) {
				t.Errorf("Allow: %v, want ErrBadTopic", err)
			}
		})
	}
	// The longest topic fits a key.
	if _, err := b.Hide(ctx, strings.Repeat("é", MaxTopicBytes/2), "alice", "", time.Now()); err != nil {
		t.Errorf("the longest topic: %v", err)
	}
	for _, topic := range []string{"a", "a.b", "a b/c", "机器人", strings.Repeat("z", MaxTopicBytes)} {
		kind, got, ok := parseKey(decisionKey(topic))
		if !ok || kind != decisionPrefix || got != topic {
			t.Errorf("key of %q reads back as %q, %q, %v", topic, kind, got, ok)
		}
	}
}

// TestNoJetStream: a NATS server without JetStream cannot keep the
// moderation, and Open says so (ErrUnavailable), at once.
func TestNoJetStream(t *testing.T) {
	ns := testenv.NATSWithoutJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Open(ctx, js(t, ns.ClientURL()), Config{Bucket: DefaultBucket}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Open: %v, want ErrUnavailable", err)
	}
	w := NewWatcher(js(t, ns.ClientURL()), Config{Bucket: DefaultBucket}, false, prometheus.NewRegistry(), zap.NewNop(), time.Now)
	if err := w.Load(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Load: %v, want ErrUnavailable", err)
	}
	// Never read: nothing is hidden, review is off, the list is whole.
	if got := names(w.Screen(entries("a", "b"), 5)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("unread, without review: %v", got)
	}
}

// TestScreensTheTrendingList runs a real trend service under review: its
// answer lists nothing until a topic is allowed, though it comes from the
// cache, and the surge it would have shown waits in the bucket meanwhile.
func TestScreensTheTrendingList(t *testing.T) {
	srv := testenv.NATS(t)
	cfg := Config{Bucket: "trending_service"}
	w := startWatcher(t, srv.ClientURL(), cfg, true)
	b := openBucket(t, srv.ClientURL(), cfg)
	ctx := context.Background()

	st, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	s := trend.New(trend.Config{Minutes: true, Hours: true, CacheTTL: time.Hour, CacheSize: 10}, st, prometheus.NewRegistry(), clock)
	sk := trend.NewSketch(nil, "", "test", prometheus.NewRegistry(), zap.NewNop(), clock)
	s.UseSketch(sk)
	s.UseModeration(w)
	last := schema.Minute.Index(now)
	for m := last - 2; m <= last; m++ {
		if err := st.Add(ctx, testenv.Inc(schema.BucketOf("surge", schema.Minute, m), 0, 400), now); err != nil {
			t.Fatal(err)
		}
		sk.Merge(trend.Summary{Minutes: map[int64]map[string]int64{m: {"surge": 400}}})
	}
	if err := st.MarkHistory(ctx, schema.Minute.Start(last-30)); err != nil {
		t.Fatal(err)
	}
	list := func() (trend.Trending, error) { return s.Trending(ctx, "5m", 10) }
	tr, err := list()
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Topics) != 0 {
		t.Fatalf("under review, nothing allowed: %+v listed", tr.Topics)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		l, err := b.List(ctx)
		if err != nil {
			return err
		}
		if len(l.Waiting) != 1 || l.Waiting[0].Topic != "surge" || l.Waiting[0].Count != 1200 {
			return fmt.Errorf("waiting %+v, want the surge with its 1,200 mentions", l.Waiting)
		}
		return nil
	})
	if _, err := b.Allow(ctx, "surge", "alice", "", time.Now()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		tr, err := list()
		if err != nil {
			return err
		}
		if tr.Source != "cache" || len(tr.Topics) != 1 || tr.Topics[0].Topic != "surge" {
			return fmt.Errorf("from %s: %+v, want the cached surge", tr.Source, tr.Topics)
		}
		return nil
	})
}

// TestWatchOutlivesARestart: while the NATS server restarts, the watcher
// screens with the copy it has (the hidden topic stays hidden); once the
// server is back, the watch is too, and a hide made then reaches it.
func TestWatchOutlivesARestart(t *testing.T) {
	srv := testenv.NATS(t)
	cfg := Config{Bucket: "trending_restart"}
	w := startWatcher(t, srv.ClientURL(), cfg, false)
	ctx := context.Background()
	if _, err := openBucket(t, srv.ClientURL(), cfg).Hide(ctx, "bots", "alice", "", time.Now()); err != nil {
		t.Fatal(err)
	}
	ranked := entries("bots", "spam", "golang")
	screened(t, w.Watcher, ranked, 3, "spam", "golang")

	srv = testenv.RestartNATS(t, srv)
	if got := names(w.Screen(ranked, 3)); !slices.Equal(got, []string{"spam", "golang"}) {
		t.Errorf("across the restart: %v, want bots still hidden", got)
	}
	if _, err := openBucket(t, srv.ClientURL(), cfg).Hide(ctx, "spam", "alice", "", time.Now()); err != nil {
		t.Fatal(err)
	}
	// The watch comes back once the connection has (the reconnection
	// ends the watch), after waits.Watch's waits while JetStream
	// recovers: seconds (3 to 9 here), not the 20 s and more its consumer
	// takes to notice missing heartbeats.
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := names(w.Screen(ranked, 3)); !slices.Equal(got, []string{"golang"}) {
			return fmt.Errorf("after the restart: %v, want spam hidden too", got)
		}
		return nil
	})
	reconnected := func(e observer.LoggedEntry) bool {
		return e.ContextMap()["error"] == "moderation: NATS reconnected: watching again"
	}
	if !slices.ContainsFunc(w.logs.FilterMessageSnippet("watch ended").All(), reconnected) {
		t.Errorf("the reconnection did not end the watch: %v", w.logs.All())
	}
}

// TestWaitingIsBounded: past MaxWaiting topics waiting for review (here
// two), a new one is not recorded, and counted: anyone who reads the list
// chooses the windows and limits that note topics, and every sidecar
// holds them all.
func TestWaitingIsBounded(t *testing.T) {
	srv := testenv.NATS(t)
	cfg := Config{Bucket: "trending_bounded"}
	w := startWatcher(t, srv.ClientURL(), cfg, true)
	w.maxWaiting = 2 // before any Screen: Run does not read it
	b := openBucket(t, srv.ClientURL(), cfg)
	ctx := context.Background()
	if got := w.Screen(entries("a", "b"), 3); len(got) != 0 {
		t.Errorf("under review with nothing allowed: %v listed", names(got))
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		l, err := b.List(ctx)
		if err != nil {
			return err
		}
		if len(l.Waiting) != 2 {
			return fmt.Errorf("%d waiting, want a and b", len(l.Waiting))
		}
		w.qmu.Lock()
		defer w.qmu.Unlock()
		if len(w.queued) != 0 {
			return fmt.Errorf("%d still queued", len(w.queued))
		}
		return nil
	})
	w.Screen(entries("c"), 3)
	if n := testutil.ToFloat64(w.m.unrecorded); n != 1 {
		t.Errorf("unrecorded %v, want 1: the waiting list is full", n)
	}
	w.qmu.Lock()
	defer w.qmu.Unlock()
	if len(w.queued) != 0 {
		t.Errorf("%d topics queued past the bound", len(w.queued))
	}
}
