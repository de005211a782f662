package quarantine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/quarantine"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// losing is the embedded store whose next write of topic lose is applied
// and its answer lost, and whose next write of topic refuse is refused
// without being applied.
type losing struct {
	*store.Bolt
	lose, refuse string
}

func (l *losing) Add(ctx context.Context, w store.Write, now time.Time) error {
	switch w.Counter.Topic {
	case l.refuse:
		l.refuse = ""
		return fmt.Errorf("injected: %w", store.ErrDenied)
	case l.lose:
		l.lose = ""
		if err := l.Bolt.Add(ctx, w, now); err != nil {
			return err
		}
		return fmt.Errorf("%w: injected: answer lost", store.ErrAmbiguous)
	}
	return l.Bolt.Add(ctx, w, now)
}

func newStore(t *testing.T) *losing {
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &losing{Bolt: b}
}

func total(t *testing.T, st *losing, topic string) int64 {
	t.Helper()
	got, err := st.Gather(context.Background(), topic, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := schema.Sum(got)
	return n
}

func held(topic string, delta int64) quarantine.Entry {
	w := store.Write{Counter: schema.TotalOf(topic), Delta: delta, Writer: store.NewWriterID(), Seq: time.Now().UnixMicro()}
	return quarantine.Of(w, "AccessDeniedException", time.Now().Add(-time.Hour), time.Now())
}

func replay(t *testing.T, q quarantine.Store, st quarantine.Writer) quarantine.Result {
	t.Helper()
	r, err := quarantine.Replay(context.Background(), q, st, store.NewSequencer(time.Now), store.NewWriterID, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReplayIsExactlyOnce: a replay whose write lands and loses its
// answer leaves the entry, with the identity it sent; the next replay
// sends the same write, which the store's mark reads as applied, and
// removes it: the count is in once. A write refused stays held.
func TestReplayIsExactlyOnce(t *testing.T) {
	ctx := context.Background()
	q, err := quarantine.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t)
	for _, e := range []quarantine.Entry{held("lost", 7), held("refused", 3)} {
		if err := q.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	st.lose, st.refuse = "lost", "refused"
	r := replay(t, q, st)
	if len(r.Written) != 0 || len(r.Left) != 2 {
		t.Fatalf("first replay = %+v; want both left (one in doubt, one refused)", r)
	}
	if got := total(t, st, "lost"); got != 7 {
		t.Fatalf("lost = %d after its answer was lost, want 7 (applied)", got)
	}
	es, err := q.List(ctx)
	if err != nil || len(es) != 2 || es[0].Topic != "lost" || es[0].Replay == nil || es[1].Replay != nil {
		t.Fatalf("held after the first replay: %+v, %v; want both, the one in doubt with the identity it was sent under, the refused one with none", es, err)
	}
	r = replay(t, q, st)
	if len(r.Written) != 2 || len(r.Left) != 0 || r.Mentions() != 10 {
		t.Fatalf("second replay = %+v; want both written", r)
	}
	if a, b := total(t, st, "lost"), total(t, st, "refused"); a != 7 || b != 3 {
		t.Fatalf("after the second replay lost=%d refused=%d, want 7 and 3: each once", a, b)
	}
	if es, _ := q.List(ctx); len(es) != 0 {
		t.Fatalf("still held: %+v", es)
	}
}

// TestReplayStopsWhenItCannotRecord: a quarantine that cannot record a
// replay's identity sends nothing (a write sent under an identity not
// recorded could be sent again under another, and count twice).
func TestReplayStopsWhenItCannotRecord(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	q, err := quarantine.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Put(ctx, held("x", 4)); err != nil {
		t.Fatal(err)
	}
	st := newStore(t)
	_, err = quarantine.Replay(ctx, failingPut{q}, st, store.NewSequencer(time.Now), store.NewWriterID, time.Now)
	if !errors.Is(err, errPut) {
		t.Fatalf("Replay = %v, want the put's error", err)
	}
	if got := total(t, st, "x"); got != 0 {
		t.Fatalf("x = %d: written without a recorded identity", got)
	}
}

var errPut = errors.New("injected: put refused")

type failingPut struct{ *quarantine.Dir }

func (failingPut) Put(context.Context, quarantine.Entry) error { return errPut }

// TestRefusedReplayTakesAFreshIdentity: a replay tried while the store
// still refuses the write drops the identity it minted (its only send was
// refused: nothing applied), so a replay after the fix, an hour and 30
// other writers later (the item's floor raised past that identity), sends
// under a fresh one and writes the delta rather than read the floor as
// "can no longer tell".
func TestRefusedReplayTakesAFreshIdentity(t *testing.T) {
	ctx := context.Background()
	clock := testenv.NewClock(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	q, err := quarantine.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t)
	w := store.Write{Counter: schema.TotalOf("t"), Delta: 5, Writer: store.NewWriterID(), Seq: clock.Now().UnixMicro()}
	if err := q.Put(ctx, quarantine.Of(w, "AccessDeniedException", clock.Now(), clock.Now())); err != nil {
		t.Fatal(err)
	}
	st.refuse = "t"
	r, err := quarantine.Replay(ctx, q, st, store.NewSequencer(clock.Now), store.NewWriterID, clock.Now)
	if err != nil || len(r.Left) != 1 {
		t.Fatalf("replay while refused = %+v, %v; want the entry left", r, err)
	}
	if es, _ := q.List(ctx); len(es) != 1 || es[0].Replay != nil {
		t.Fatalf("after a refused replay the entry is %+v; want its identity dropped", es)
	}
	clock.Add(time.Hour)
	for i := range 30 {
		x := store.Write{Counter: schema.TotalOf("t"), Delta: 1, Writer: fmt.Sprintf("w%02d", i), Seq: clock.Now().Add(-30*time.Minute).UnixMicro() + int64(i)}
		if err := st.Add(ctx, x, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	r, err = quarantine.Replay(ctx, q, st, store.NewSequencer(clock.Now), store.NewWriterID, clock.Now)
	if err != nil || len(r.Written) != 1 {
		t.Fatalf("replay after the fix = %+v, %v; want it written", r, err)
	}
	if got := total(t, st, "t"); got != 35 {
		t.Fatalf("total = %d, want 35 (30 + the quarantined 5)", got)
	}
}
