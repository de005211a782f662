package lookup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hotcount/hotcount/lookup"
)

// guard bounds a test's wait for an event that should come at once.
const guard = 10 * time.Second

// onItsWay is a writer whose writes the test puts on their way and takes
// off; each time Sending finds one on its way, asked tells.
type onItsWay struct {
	mu     sync.Mutex
	topics map[string]bool
	asked  chan string
}

func newOnItsWay() *onItsWay {
	return &onItsWay{topics: make(map[string]bool), asked: make(chan string, 1024)}
}

func (w *onItsWay) Sending(topic string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.topics[topic] {
		w.asked <- topic
	}
	return w.topics[topic]
}

func (w *onItsWay) set(topic string, on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.topics[topic] = on
}

// answer is a lookup's.
type answer struct {
	total lookup.Total
	err   error
}

// lookupAsync looks topic up on a goroutine of its own.
func lookupAsync(svc *lookup.Service, topic string) <-chan answer {
	res := make(chan answer, 1)
	go func() {
		t, err := svc.Lookup(context.Background(), topic, lookup.Cached)
		res <- answer{t, err}
	}()
	return res
}

// count waits up to within for the lookup's answer, its count.
func count(t *testing.T, res <-chan answer, within time.Duration) int64 {
	t.Helper()
	select {
	case a := <-res:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a.total.Count
	case <-time.After(within):
		t.Fatalf("the lookup did not return within %s", within)
		return 0
	}
}

// landedWithin bounds the wait for a lookup woken by a landing: well
// under the gather's own deadline (5 s), past which it stops waiting and,
// told of the write, reads again anyway, with the same count.
const landedWithin = 2 * time.Second

// TestLookupWaitsForAWriteToLand: a gather that finds a write of its
// topic on its way waits for it, and returns as soon as it lands (the
// writer's reader told, Wrote), with the write's count: it is not looking
// again on its own (an hour apart here).
func TestLookupWaitsForAWriteToLand(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "golang", 0, 5)
	svc, _ := newService(t, st, time.Minute, time.Minute, nil)
	lookup.SetUnlanded(svc, time.Hour)
	w := newOnItsWay()
	svc.WatchWrites(w)
	w.set("golang", true)
	sent := time.Now()

	res := lookupAsync(svc, "golang")
	for range 2 { // found on its way as the gather ended, then as it waits
		select {
		case <-w.asked:
		case <-time.After(guard):
			t.Fatalf("the lookup did not ask about the write within %s", guard)
		}
	}
	select {
	case a := <-res:
		t.Fatalf("the lookup returned %+v while the write was on its way", a)
	default:
	}

	add(t, b, "golang", 1, 3) // the write lands
	w.set("golang", false)
	svc.Wrote("golang", 3, sent, time.Now())
	if got := count(t, res, landedWithin); got != 8 {
		t.Errorf("count = %d, want 8, the landed write's included", got)
	}
}

// TestLookupWaitsForAWriteThatDoesNotLand: a write that stops being on
// its way without landing (in doubt, refused: nobody is told) ends the
// wait too, at the writer's next asking.
func TestLookupWaitsForAWriteThatDoesNotLand(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "golang", 0, 5)
	svc, _ := newService(t, st, time.Minute, time.Minute, nil)
	w := newOnItsWay()
	svc.WatchWrites(w)
	w.set("golang", true)

	res := lookupAsync(svc, "golang")
	for range 2 {
		select {
		case <-w.asked:
		case <-time.After(guard):
			t.Fatalf("the lookup did not ask about the write within %s", guard)
		}
	}
	w.set("golang", false) // refused, say
	if got := count(t, res, guard); got != 5 {
		t.Errorf("count = %d, want 5", got)
	}
}
