package quarantine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/durability/quarantine"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
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
	n, _ := store.Sum(got)
	return n
}

func held(topic string, delta int64) quarantine.Entry {
	w := store.Write{Counter: store.TotalOf(topic), Delta: delta, Writer: store.NewWriterID(), Seq: time.Now().UnixMicro()}
	return quarantine.Of(w, "", "AccessDeniedException", time.Now().Add(-time.Hour), time.Now())
}

func replay(t *testing.T, q quarantine.Store, st quarantine.Writer) quarantine.Result {
	t.Helper()
	r, err := quarantine.Replay(context.Background(), q, st, nil, store.NewSequencer(time.Now), store.NewWriterID, time.Now)
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

// TestKVKeepsEntries: the durable modes' quarantine, a JetStream bucket
// on a real server, keeps, lists (oldest first) and deletes entries, and
// an empty bucket lists nothing.
func TestKVKeepsEntries(t *testing.T) {
	ctx := context.Background()
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	q, err := quarantine.OpenKV(ctx, js, quarantine.DefaultBucket, 0)
	if err != nil {
		t.Fatal(err)
	}
	if es, err := q.List(ctx); err != nil || len(es) != 0 {
		t.Fatalf("empty bucket lists %+v, %v", es, err)
	}
	a, b := held("a", 1), held("b", 2)
	b.At = a.At.Add(time.Second)
	for _, e := range []quarantine.Entry{b, a} {
		if err := q.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	es, err := q.List(ctx)
	if err != nil || len(es) != 2 || es[0].Topic != "a" || es[1].Topic != "b" || es[1].Delta != 2 || es[1].Reason != "AccessDeniedException" {
		t.Fatalf("List = %+v, %v; want a then b, whole", es, err)
	}
	st := newStore(t)
	if r := replay(t, q, st); len(r.Written) != 2 {
		t.Fatalf("replay = %+v", r)
	}
	if es, err := q.List(ctx); err != nil || len(es) != 0 {
		t.Fatalf("after the replay the bucket lists %+v, %v", es, err)
	}
	if err := q.Delete(ctx, a); err != nil {
		t.Fatalf("deleting an entry already gone = %v, want nil", err)
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
	_, err = quarantine.Replay(ctx, failingPut{q}, st, nil, store.NewSequencer(time.Now), store.NewWriterID, time.Now)
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

// TestReplayFollowsTheHandOver: an entry not released (its sidecar
// stopped while handing it over from its journal entry) is written only
// when the journal entry marks it as the quarantine's; left while the
// journal entry holds it unmarked (the journal writes it); removed, not
// written, once the journal entry is gone without the mark (the journal
// wrote it). Release marks an entry released.
func TestReplayFollowsTheHandOver(t *testing.T) {
	ctx := context.Background()
	q, err := quarantine.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t)
	entry := func(topic string, delta int64) quarantine.Entry {
		w := store.Write{Counter: store.TotalOf(topic), Delta: delta, Writer: store.NewWriterID(), Seq: time.Now().UnixMicro()}
		return quarantine.Of(w, topic+"-entry", "AccessDeniedException", time.Now().Add(-time.Hour), time.Now())
	}
	marked, unmarked, gone := entry("marked", 3), entry("unmarked", 4), entry("gone", 5)
	for _, e := range []quarantine.Entry{marked, unmarked, gone} {
		if e.Released {
			t.Fatalf("%+v released before its journal entry marks it", e)
		}
		if err := q.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	j := func(_ context.Context, key, _ string) (bool, bool, error) {
		switch key {
		case "marked-entry":
			return true, true, nil
		case "unmarked-entry":
			return true, false, nil
		}
		return false, false, nil
	}
	r, err := quarantine.Replay(ctx, q, st, j, store.NewSequencer(time.Now), store.NewWriterID, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Written) != 1 || r.Written[0].Topic != "marked" || len(r.Journaled) != 1 || r.Journaled[0].Topic != "gone" ||
		len(r.Left) != 1 || r.Left[0].Topic != "unmarked" || !strings.Contains(r.Left[0].Error, "holds the write") {
		t.Fatalf("Replay = %+v; want marked written, gone removed, unmarked left", r)
	}
	if m, u, g := total(t, st, "marked"), total(t, st, "unmarked"), total(t, st, "gone"); m != 3 || u != 0 || g != 0 {
		t.Fatalf("store marked=%d unmarked=%d gone=%d; want 3, 0, 0", m, u, g)
	}
	if err := quarantine.Release(ctx, q, unmarked.Key()); err != nil {
		t.Fatal(err)
	}
	if e, ok, err := q.Get(ctx, unmarked.Key()); err != nil || !ok || !e.Released {
		t.Fatalf("after Release: %+v, %v, %v", e, ok, err)
	}
	if err := quarantine.Release(ctx, q, "nobody.1"); err != nil {
		t.Fatalf("Release of an entry gone (written) = %v, want nil: the journal's replay must be able to finish", err)
	}
}

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
	w := store.Write{Counter: store.TotalOf("t"), Delta: 5, Writer: store.NewWriterID(), Seq: clock.Now().UnixMicro()}
	if err := q.Put(ctx, quarantine.Of(w, "", "AccessDeniedException", clock.Now(), clock.Now())); err != nil {
		t.Fatal(err)
	}
	st.refuse = "t"
	r, err := quarantine.Replay(ctx, q, st, nil, store.NewSequencer(clock.Now), store.NewWriterID, clock.Now)
	if err != nil || len(r.Left) != 1 {
		t.Fatalf("replay while refused = %+v, %v; want the entry left", r, err)
	}
	if es, _ := q.List(ctx); len(es) != 1 || es[0].Replay != nil {
		t.Fatalf("after a refused replay the entry is %+v; want its identity dropped", es)
	}
	clock.Add(time.Hour)
	for i := range 30 {
		x := store.Write{Counter: store.TotalOf("t"), Delta: 1, Writer: fmt.Sprintf("w%02d", i), Seq: clock.Now().Add(-30*time.Minute).UnixMicro() + int64(i)}
		if err := st.Add(ctx, x, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	r, err = quarantine.Replay(ctx, q, st, nil, store.NewSequencer(clock.Now), store.NewWriterID, clock.Now)
	if err != nil || len(r.Written) != 1 {
		t.Fatalf("replay after the fix = %+v, %v; want it written", r, err)
	}
	if got := total(t, st, "t"); got != 35 {
		t.Fatalf("total = %d, want 35 (30 + the quarantined 5)", got)
	}
}
