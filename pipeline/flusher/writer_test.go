package flusher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// scripted is a store that answers each Add with the next of its errors
// (nil once they run out) and records what it was sent.
type scripted struct {
	mu   sync.Mutex
	errs []error
	sent []store.Write
}

func (s *scripted) Add(_ context.Context, w store.Write, _ time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, w)
	if len(s.errs) == 0 {
		return nil
	}
	err := s.errs[0]
	s.errs = s.errs[1:]
	return err
}

// raising is shard counts that raise every throttled topic to n.
type raising struct{ n int }

func (raising) WriteCounts(context.Context, []string) (map[string]int, error) { return nil, nil }
func (r raising) Throttled(context.Context, string) int                       { return r.n }

func testWriter(t *testing.T, st Store, sh Shards) (*writer, prometheus.Counter) {
	rerouted := prometheus.NewCounter(prometheus.CounterOpts{Name: "rerouted"})
	return &writer{store: st, shards: sh, seq: store.NewSequencer(time.Now), timeout: time.Second, limit: 4,
		log: zaptest.NewLogger(t), rerouted: rerouted, now: time.Now}, rerouted
}

var errThrottle = fmt.Errorf("injected: %w", store.ErrThrottled)

// TestOutcomeOf: only a definite answer frees a delta, and doubt wins
// over a throttle.
func TestOutcomeOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want outcome
	}{
		{nil, applied},
		{errors.New("400"), refused},
		{errThrottle, throttled},
		{fmt.Errorf("%w after %w", store.ErrAmbiguous, store.ErrThrottled), inDoubt},
	} {
		if got := outcomeOf(c.err); got != c.want {
			t.Errorf("outcomeOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// TestSendReroutesThrottled: a throttled new write moves to other shards
// of its topic with new seqs, up to maxReroutes, the first throttle
// raising its shard count; on one shard it has nowhere to go.
func TestSendReroutesThrottled(t *testing.T) {
	st := &scripted{errs: []error{errThrottle, errThrottle}}
	wr, rerouted := testWriter(t, st, raising{n: 4})
	a := wr.send(context.Background(), store.Write{Counter: schema.TotalOf("hot"), Delta: 3, Writer: "w"}, 1)
	if a.outcome != applied || a.err != nil || len(st.sent) != 3 {
		t.Fatalf("answer %+v after %d attempts, want applied on the third", a, len(st.sent))
	}
	for i := 1; i < len(st.sent); i++ {
		if st.sent[i].Shard == st.sent[i-1].Shard || st.sent[i].Seq <= st.sent[i-1].Seq {
			t.Errorf("attempt %d: shard %d seq %d after shard %d seq %d: want another shard, a new seq", i, st.sent[i].Shard, st.sent[i].Seq, st.sent[i-1].Shard, st.sent[i-1].Seq)
		}
	}
	if a.write != st.sent[2] {
		t.Errorf("answer holds %+v, want the last write sent %+v", a.write, st.sent[2])
	}
	if n := testenv.Metric(t, reg(rerouted), "rerouted"); n != 2 {
		t.Errorf("rerouted %v, want 2", n)
	}

	st = &scripted{errs: []error{errThrottle}}
	wr, _ = testWriter(t, st, raising{n: 1})
	if a := wr.send(context.Background(), store.Write{Counter: schema.TotalOf("hot"), Delta: 3}, 1); a.outcome != throttled || len(st.sent) != 1 {
		t.Errorf("one shard: %+v after %d attempts, want throttled after one", a, len(st.sent))
	}
}

func reg(c prometheus.Collector) *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(c)
	return r
}

// TestSendBehindTheFloor: a write refused by the item's floor raises the
// writer's seqs past it.
func TestSendBehindTheFloor(t *testing.T) {
	floor := time.Now().Add(time.Hour).UnixMicro()
	st := &scripted{errs: []error{&store.FloorError{Key: "k", Floor: floor}}}
	wr, _ := testWriter(t, st, nil)
	a := wr.send(context.Background(), store.Write{Counter: schema.TotalOf("t"), Delta: 1}, 1)
	if a.outcome != refused {
		t.Errorf("answer %+v, want refused (nothing applied)", a)
	}
	if next := wr.seq.Next(); next <= floor {
		t.Errorf("next seq %d, want past the floor %d", next, floor)
	}
}

// TestResendSendsUnchanged: a pending write goes again as it was; one
// whose outcome can no longer be told counts as applied.
func TestResendSendsUnchanged(t *testing.T) {
	st := &scripted{errs: []error{fmt.Errorf("lost: %w", store.ErrAmbiguous), store.ErrUnresolvable}}
	wr, _ := testWriter(t, st, nil)
	w := store.Write{Counter: schema.TotalOf("t"), Shard: 2, Delta: 5, Writer: "w", Seq: 42, Retry: true}
	if a := wr.resend(context.Background(), w); a.outcome != inDoubt || !a.resend {
		t.Errorf("first resend: %+v, want in doubt", a)
	}
	if a := wr.resend(context.Background(), w); a.outcome != applied || a.err != nil {
		t.Errorf("unresolvable: %+v, want applied", a)
	}
	for _, got := range st.sent {
		if got != w {
			t.Errorf("sent %+v, want %+v unchanged", got, w)
		}
	}
}

// TestBatchBoundsWritesInFlight: a batch has at most its limit of writes
// in flight, and hands every answer, once, to the goroutine running it
// (take touches its tally without a lock: -race would see two goroutines).
func TestBatchBoundsWritesInFlight(t *testing.T) {
	wr, _ := testWriter(t, &scripted{}, nil)
	wr.limit = 3
	var (
		mu             sync.Mutex
		inFlight, most int
	)
	taken := map[string]int{}
	b := wr.batch(func(as []answer) {
		for _, a := range as {
			taken[a.write.Counter.Topic]++
		}
	})
	release := make(chan struct{})
	always := func() bool { return true }
	for i := range 20 {
		if !b.acquire(always) {
			t.Fatal("acquire refused room though ok holds")
		}
		b.run(func() answer {
			mu.Lock()
			inFlight++
			most = max(most, inFlight)
			mu.Unlock()
			<-release
			mu.Lock()
			inFlight--
			mu.Unlock()
			return answer{write: store.Write{Counter: schema.TotalOf(fmt.Sprint("t", i))}}
		})
		if i == 2 {
			close(release) // the first three fill the batch; the rest go as room frees up
		}
	}
	b.collect()
	b.wait()
	if most > 3 {
		t.Errorf("%d writes in flight at once, want at most 3", most)
	}
	if len(taken) != 20 {
		t.Errorf("%d answers taken, want 20", len(taken))
	}
	for topic, n := range taken {
		if n != 1 {
			t.Errorf("%s answered %d times", topic, n)
		}
	}
}

// TestAcquireChecksWhenTheWriteWouldStart: a write that waits for room
// is checked against its deadline when the room comes, not before the
// wait: one whose deadline passed meanwhile does not start, and gives
// its room back.
func TestAcquireChecksWhenTheWriteWouldStart(t *testing.T) {
	wr, _ := testWriter(t, &scripted{}, nil)
	wr.limit = 1
	b := wr.batch(func([]answer) {})
	release := make(chan struct{})
	if !b.acquire(func() bool { return true }) {
		t.Fatal("acquire refused an empty batch")
	}
	b.run(func() answer { <-release; return answer{} })
	var late atomic.Bool                             // the deadline passes while the write waits
	go func() { late.Store(true); close(release) }() // the room frees only after
	if b.acquire(func() bool { return !late.Load() }) {
		t.Fatal("a write whose deadline passed while it waited for room was let start")
	}
	if !b.acquire(func() bool { return true }) {
		t.Fatal("the refused write kept its room")
	}
	b.run(func() answer { return answer{} })
	b.wait()
}

// TestSlowestDecays: one slow write raises the room at once, and is
// forgotten by halves each second, so writes start again near a deadline
// once the store is fast (none need start to show it).
func TestSlowestDecays(t *testing.T) {
	var s slowest
	if d := s.get(); d != 0 {
		t.Fatalf("no write yet: %s, want 0", d)
	}
	s.note(4 * time.Second)
	at := s.at
	if d := s.decayed(at.Add(2 * halfLife)); d != time.Second {
		t.Errorf("two half-lives after a 4s write: %s, want 1s", d)
	}
	s.note(time.Millisecond) // a fast write does not hide the slow one
	if d := s.get(); d < 3*time.Second {
		t.Errorf("right after a 4s write and a fast one: %s, want about 4s", d)
	}
}
