package journal

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// guard bounds a test's wait for an event that should come at once.
const guard = 10 * time.Second

// watched is a bucket whose watches the test sees start, and can make
// fail: its next fails WatchAll calls fail, and all of them while down.
type watched struct {
	jetstream.KeyValue
	down     atomic.Bool
	fails    atomic.Int32
	watchers chan jetstream.KeyWatcher // each watch started
	failed   chan struct{}             // each WatchAll that failed
}

func newWatched(kv jetstream.KeyValue) *watched {
	return &watched{KeyValue: kv, watchers: make(chan jetstream.KeyWatcher, 64), failed: make(chan struct{}, 1024)}
}

func (w *watched) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if w.down.Load() || w.fails.Add(-1) >= 0 {
		w.failed <- struct{}{}
		return nil, errors.New("injected: bucket unavailable")
	}
	kw, err := w.KeyValue.WatchAll(ctx, opts...)
	if err == nil {
		w.watchers <- kw
	}
	return kw, err
}

// bucket creates a bucket of entries on a NATS server of the test's.
func bucket(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	ns := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "COVERAGE"})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

func putEntry(t *testing.T, kv jetstream.KeyValue, key string, seqs ...[2]int64) {
	t.Helper()
	b, err := json.Marshal(Entry{Writer: WriterOf(key), Seqs: seqs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), key, b); err != nil {
		t.Fatal(err)
	}
}

// watching runs c's watch of kv until the test ends, and returns a channel
// closed when it has returned and the function that ends it.
func watching(t *testing.T, c *coverage, kv jetstream.KeyValue) (<-chan struct{}, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.watch(ctx, kv, zaptest.NewLogger(t)) }()
	t.Cleanup(func() { cancel(); <-done })
	return done, cancel
}

// next waits for an event of ch.
func next[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatalf("no %s within %s", what, guard)
		panic("unreachable")
	}
}

func wantCovered(t *testing.T, c *coverage, seq int64, want bool) {
	t.Helper()
	got, err := c.covered(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("covered(%d) = %v, want %v", seq, got, want)
	}
}

// TestCoverageWatchesAgainAfterItsBucketIsBack: the watch of the bucket
// ends (its bucket gone), the watches that follow fail while it is away,
// and once it is back a new watch reads it: the copy is the new bucket's.
func TestCoverageWatchesAgainAfterItsBucketIsBack(t *testing.T) {
	ctx := context.Background()
	js, kv := bucket(t)
	putEntry(t, kv, "a.1", [2]int64{1, 5})
	w := newWatched(kv)
	c := newCoverage()
	c.backOff = func() backoff.BackOff {
		return &backoff.ExponentialBackOff{InitialInterval: time.Millisecond, Multiplier: 2, MaxInterval: 5 * time.Millisecond}
	}
	readings := make(chan struct{}, 16)
	c.read = func() { readings <- struct{}{} }
	watching(t, c, w)

	first := next(t, w.watchers, "watch")
	next(t, readings, "reading")
	wantCovered(t, c, 3, true)
	wantCovered(t, c, 11, false)

	// The bucket goes, and its watch ends; watching again fails until
	// it is back.
	w.down.Store(true)
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, "COVERAGE"); err != nil {
		t.Fatal(err)
	}
	next(t, w.failed, "failed watch")
	next(t, w.failed, "second failed watch")
	wantCovered(t, c, 3, true) // the last reading answers meanwhile

	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "COVERAGE"}); err != nil {
		t.Fatal(err)
	}
	putEntry(t, kv, "b.1", [2]int64{10, 12})
	w.down.Store(false)
	next(t, w.watchers, "watch of the bucket back")
	next(t, readings, "reading of the bucket back")
	wantCovered(t, c, 11, true)
	wantCovered(t, c, 3, false)
}

// steps is a back-off whose first two waits after a Reset are none, and
// any later one an hour.
type steps struct {
	mu sync.Mutex
	n  int
}

func (s *steps) NextBackOff() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	if s.n <= 2 {
		return 0
	}
	return time.Hour
}

func (s *steps) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n = 0
}

// TestCoverageBackOff: two watches fail (two waits used), the third
// reads the bucket; when it ends, the waits start again from the first
// (without that the next would be an hour), and once they are spent the
// watch, waiting its hour, returns as soon as its context ends.
func TestCoverageBackOff(t *testing.T) {
	_, kv := bucket(t)
	w := newWatched(kv)
	w.fails.Store(2)
	c := newCoverage()
	c.backOff = func() backoff.BackOff { return &steps{} }
	done, cancel := watching(t, c, w)

	next(t, w.failed, "failed watch")
	next(t, w.failed, "second failed watch")
	kw := next(t, w.watchers, "watch")
	waitReady(t, c)
	w.fails.Store(2)
	if err := kw.Stop(); err != nil {
		t.Fatal(err)
	}
	next(t, w.failed, "watch again after one that worked")
	next(t, w.failed, "second watch again")

	cancel()
	next(t, done, "return after the context ended")
}

func waitReady(t *testing.T, c *coverage) {
	t.Helper()
	select {
	case <-c.ready:
	case <-time.After(guard):
		t.Fatalf("no reading within %s", guard)
	}
}

// creating is a bucket whose Create fails, with err, its first fails
// calls, each of which it reports to onFail.
type creating struct {
	jetstream.KeyValue
	fails  int
	err    error
	calls  int
	onFail func()
}

func (c *creating) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	c.calls++
	if c.calls > c.fails {
		return 1, nil
	}
	if c.onFail != nil {
		c.onFail()
	}
	return 0, c.err
}

// TestCreateTriesThreeTimes: an entry's put is tried again after a
// failure, up to three times; a key found there means an earlier try
// landed; and no try follows once the context has ended.
func TestCreateTriesThreeTimes(t *testing.T) {
	failing := errors.New("injected: no answer")
	for _, tc := range []struct {
		name    string
		kv      *creating
		calls   int
		wantErr error
	}{
		{"lands on the third try", &creating{fails: 2, err: failing}, 3, nil},
		{"fails three times", &creating{fails: 5, err: failing}, 3, failing},
		{"an earlier try landed", &creating{fails: 1, err: jetstream.ErrKeyExists}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &Journal{kv: tc.kv, m: NewMetrics(prometheus.NewRegistry())}
			err := j.create(context.Background(), "w.1", []byte("{}"))
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Errorf("create = %v, want %v", err, tc.wantErr)
			}
			if tc.kv.calls != tc.calls {
				t.Errorf("Create called %d times, want %d", tc.kv.calls, tc.calls)
			}
		})
	}
	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		kv := &creating{fails: 5, err: failing, onFail: cancel}
		j := &Journal{kv: kv, m: NewMetrics(prometheus.NewRegistry())}
		if err := j.create(ctx, "w.1", []byte("{}")); !errors.Is(err, context.Canceled) {
			t.Errorf("create = %v, want the context's end", err)
		}
		if kv.calls != 1 {
			t.Errorf("Create called %d times after the context ended, want 1", kv.calls)
		}
	})
}
