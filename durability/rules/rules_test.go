package rules_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
)

// setup is a NATS server with a stream of mentions (as jetstream mode's)
// and a book on a bucket of its own.
func setup(t *testing.T) (jetstream.JetStream, *rules.Book, jetstream.KeyValue) {
	t.Helper()
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "checkpoints"})
	if err != nil {
		t.Fatal(err)
	}
	return js, rules.NewBook(js, kv), kv
}

func own(maxCount int64) rules.Rules {
	return rules.Rules{Mode: rules.ModeJetStream, Subject: "mentions.>", Table: "hotcount", MaxCount: maxCount, MaxTopicBytes: 256,
		MaxLateness: rules.Duration(24 * time.Hour), Minutes: true}
}

func publish(t *testing.T, js jetstream.JetStream, n int) uint64 {
	t.Helper()
	var last uint64
	for range n {
		ack, err := js.Publish(context.Background(), "mentions.golang", nil)
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	return last
}

// Two first readers with different settings at once: one records its
// rules, and both get the same history, which judges the messages stored
// before it too.
func TestFirstRulesByCompareAndSet(t *testing.T) {
	js, book, _ := setup(t)
	publish(t, js, 5)
	var wg sync.WaitGroup
	got := make([]rules.History, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Go(func() { got[i], errs[i] = book.Open(context.Background(), "MENTIONS", own(int64(100*(i+1)))) })
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil {
			t.Fatalf("reader %d: %v", i, errs[i])
		}
		if len(got[i]) != 1 || got[i][0] != got[0][0] {
			t.Fatalf("reader %d has history %+v, reader 0 %+v: two first rules recorded", i, got[i], got[0])
		}
	}
	first := got[0][0]
	if first.Seq != 0 {
		t.Fatalf("the first rules are at sequence %d, want 0 (from the start)", first.Seq)
	}
	if m := first.Rules.MaxCount; m%100 != 0 || m < 100 || m > 800 {
		t.Fatalf("the first rules have --max-count %d, which no reader proposed", m)
	}
	st, err := js.Stream(context.Background(), "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 5 {
		t.Fatalf("the stream holds %d messages, want the 5 mentions: the first rules are kept in the bucket only", n)
	}
}

// A change applies from the message after it: the messages before are
// judged by the rules they were stored under, whatever the order of
// reading.
func TestSetAppliesFromItsSequence(t *testing.T) {
	js, book, _ := setup(t)
	ctx := context.Background()
	h, err := book.Open(ctx, "MENTIONS", own(100))
	if err != nil {
		t.Fatal(err)
	}
	epoch := h[0].Epoch
	before := publish(t, js, 3)
	c, err := book.Set(ctx, "MENTIONS", own(1000), "raise the cap", h[0])
	if err != nil {
		t.Fatal(err)
	}
	after := publish(t, js, 3)
	if c.Seq <= before || c.Seq >= after {
		t.Fatalf("the change is at %d, want between %d and %d", c.Seq, before, after)
	}
	h, err = book.History(ctx, "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 2 || h[1].Why != "raise the cap" || h[1].By == "" {
		t.Fatalf("history %+v, want the first rules and the change with its reason and author", h)
	}
	for seq, want := range map[uint64]int64{1: 100, before: 100, c.Seq: 100, c.Seq + 1: 1000, after: 1000} {
		if r, _ := h.In(epoch, seq); r.MaxCount != want {
			t.Errorf("sequence %d judged with --max-count %d, want %d", seq, r.MaxCount, want)
		}
	}
}

// The history outlives the messages: a stream whose limits dropped the
// rules messages still has its rules.
func TestHistoryOutlivesTheMessages(t *testing.T) {
	js, book, _ := setup(t)
	ctx := context.Background()
	h0, err := book.Open(ctx, "MENTIONS", own(100))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := book.Set(ctx, "MENTIONS", own(7), "lower", h0[0]); err != nil {
		t.Fatal(err)
	}
	publish(t, js, 2)
	st, _ := js.Stream(ctx, "MENTIONS")
	if err := st.Purge(ctx); err != nil { // as max age would
		t.Fatal(err)
	}
	h, err := book.Open(ctx, "MENTIONS", own(555))
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := h.In(h[0].Epoch, 100); !ok || r.MaxCount != 7 {
		t.Fatalf("after the messages aged out the rules are %+v (ok %v), want --max-count 7", r, ok)
	}
}

// A history that names a change the stream no longer holds (a stream
// restored from a backup keeps its creation time) is refused, not read
// by older rules in silence.
func TestRolledBackRulesAreRefused(t *testing.T) {
	js, book, kv := setup(t)
	ctx := context.Background()
	h, err := book.Open(ctx, "MENTIONS", own(100))
	if err != nil {
		t.Fatal(err)
	}
	// The history as it was after a change at 50, which the restored
	// stream (ending at 10) never had.
	publish(t, js, 9)
	later := append(h, rules.Change{Epoch: h[0].Epoch, Seq: 50, By: "ops", Why: "after the backup", Rules: own(9)})
	v, _ := json.Marshal(later)
	if _, err := kv.Put(ctx, "rules.MENTIONS", v); err != nil {
		t.Fatal(err)
	}
	if _, err := book.Open(ctx, "MENTIONS", own(100)); !errors.Is(err, rules.ErrRolledBack) {
		t.Fatalf("Open = %v, want ErrRolledBack", err)
	}
	// Or a mention where the change was.
	publish(t, js, 45)
	if _, err := book.Open(ctx, "MENTIONS", own(100)); !errors.Is(err, rules.ErrRolledBack) {
		t.Fatalf("Open with a mention at the change's sequence = %v, want ErrRolledBack", err)
	}
}

// A stream created again carries the rules of its earlier creation, not
// the first reader's settings.
func TestRecreatedStreamCarriesItsRules(t *testing.T) {
	js, book, _ := setup(t)
	ctx := context.Background()
	h0, err := book.Open(ctx, "MENTIONS", own(100))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := book.Set(ctx, "MENTIONS", own(42), "a fleet's rule", h0[0]); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "MENTIONS"); err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if store.EpochOf(st.CachedInfo().Created) == h0[0].Epoch {
		t.Fatal("the stream created again has its earlier creation's time: the test proves nothing")
	}
	h, err := book.Open(ctx, "MENTIONS", own(999))
	if err != nil {
		t.Fatal(err)
	}
	r, ok := h.In(store.EpochOf(st.CachedInfo().Created), 1)
	if !ok || r.MaxCount != 42 {
		t.Fatalf("the new creation's rules are %+v (ok %v), want the earlier creation's --max-count 42", r, ok)
	}
}

// Two changes made from the same rules at once: one is recorded, the
// others refused, so none silently puts back what another changed.
func TestConcurrentChangesOneWins(t *testing.T) {
	_, book, _ := setup(t)
	ctx := context.Background()
	h, err := book.Open(ctx, "MENTIONS", own(100))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() { _, errs[i] = book.Set(ctx, "MENTIONS", own(int64(1000+i)), "mine", h[0]) })
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, rules.ErrChanged):
			t.Fatalf("Set = %v, want nil or ErrChanged", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d changes recorded from the same rules, want 1", won)
	}
	got, err := book.History(ctx, "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("history %+v, want the first rules and one change", got)
	}
}

// Differences name each setting, and only the ones a reader cannot
// follow are structural.
func TestDifferences(t *testing.T) {
	a, b := own(100), own(1000)
	b.Region, b.Hours = "us-east-1", true
	ds := rules.Differences(a, b)
	names := map[string]bool{}
	for _, d := range ds {
		names[d.Setting] = d.Structural
	}
	want := map[string]bool{"region": true, "max-count": false, "windows": false}
	if len(names) != len(want) {
		t.Fatalf("differences %v, want %v", ds, want)
	}
	for s, structural := range want {
		if got, ok := names[s]; !ok || got != structural {
			t.Errorf("--%s: structural %v (present %v), want %v", s, got, ok, structural)
		}
	}
	if len(rules.Structural(ds)) != 1 {
		t.Fatalf("structural %v, want the region only", rules.Structural(ds))
	}
}
