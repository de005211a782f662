package durable

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// TestRecountReadsThroughItsSpan: a recount of a span ending at to reads
// until it has seen to, even when the server it reads from has run out
// before (a replica a moment behind the one the reader read, just after
// a failover). Ending where the server runs out would claim mentions it
// never counted: the loss TestPositionClusterLosesNothing met once.
func TestRecountReadsThroughItsSpan(t *testing.T) {
	nc, js, st := mentionsStream(t)
	ctx := context.Background()
	publish := func(n int) {
		for range n {
			if _, err := js.Publish(ctx, "mentions.a", []byte(`{"count":1}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(3) // sequences 1..3 are there; 4 and 5, which the span ends with, not yet
	reg := prometheus.NewRegistry()
	e, err := New(Config{Stream: "MENTIONS", Subject: "mentions.>", Limits: mention.Limits{MaxCount: 1000, MaxTopicBytes: 256}},
		nc, nil, nil, zap.NewNop(), NewMetrics(reg), ingest.NewMetrics(reg), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	k := key{s: stream{name: "MENTIONS", epoch: epochOf(st.CachedInfo())}, c: schema.TotalOf("a")}
	type answer struct {
		rest entry
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		rest, err := e.recount(ctx, k, 1, 5)
		done <- answer{rest, err}
	}()
	recountReads(t, st)
	select {
	case a := <-done:
		t.Fatalf("the recount ended at the server's last sequence, 3, before its span's end, 5: %+v, %v", a.rest, a.err)
	default:
	}
	publish(2)
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.rest.delta != 5 || a.rest.first != 1 || a.rest.last != 5 {
		t.Errorf("recount of 1..5: %+v, want 5 mentions at 1..5", a.rest)
	}
}

// mentionsStream is a NATS server with the stream MENTIONS on mentions.>.
func mentionsStream(t *testing.T) (*nats.Conn, jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}})
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, st
}

// recountReads waits until a recount's consumer reads st.
func recountReads(t *testing.T, st jetstream.Stream) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		info, err := st.Info(context.Background())
		if err != nil {
			return err
		}
		if info.State.Consumers == 0 {
			return fmt.Errorf("no recount reads yet")
		}
		return nil
	})
}

// refuser refuses every write for good, as an IAM condition would.
type refuser struct{}

func (refuser) Add(context.Context, store.Write, time.Time) error {
	return fmt.Errorf("AccessDeniedException: %w", store.ErrDenied)
}

// TestRefusedSpanMergesWithTheNewer: a write in doubt whose retry is
// refused for good goes to the quarantine; when the record cannot take it
// (here NATS is gone), it goes back to the window, merged with the newer
// span of the same counter that waited behind it, never in its place:
// the reader will not read the newer span's sequences again.
func TestRefusedSpanMergesWithTheNewer(t *testing.T) {
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.ClientURL())
	reg := prometheus.NewRegistry()
	e, err := New(Config{Stream: "MENTIONS", Subject: "mentions.>", WriteTimeout: time.Second, Concurrency: 1, QuarantineAfter: time.Second,
		Limits: mention.Limits{MaxCount: 1000, MaxTopicBytes: 256}}, nc, refuser{}, nil, zap.NewNop(), NewMetrics(reg), ingest.NewMetrics(reg), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := e.open(ctx); err != nil {
		t.Fatal(err)
	}
	s := stream{name: "MENTIONS", epoch: 1}
	k := key{s: s, c: schema.TotalOf("a")}
	e.doubt[k] = job{k: k, e: entry{delta: 10, first: 1, last: 10}, retry: true} // sent, answer lost
	e.denied[k] = time.Now().Add(-time.Hour)                                     // refused for good since long
	for seq := uint64(11); seq <= 20; seq++ {
		e.win.add(s, seq, 1, time.Now(), k.c) // the newer span, waiting behind the doubt
	}
	nc.Close() // the record cannot be stored
	_ = e.Flush(ctx)
	d := e.win.drain()
	got, ok := d.counters[k]
	if !ok || got.delta != 20 || got.first != 1 || got.last != 20 {
		t.Fatalf("the window holds %+v for the counter, want both spans, 20 mentions at 1..20", got)
	}
}

// TestMoved: a checkpoint of another creation of the stream is news
// whichever epoch is larger (found by an outside review: a creation with
// a smaller epoch, after a server clock set back, was never stored again
// by a process that had stored the old one's).
func TestMoved(t *testing.T) {
	old := store.Position{Epoch: 200, Seq: 50}
	for _, c := range []struct {
		p    store.Position
		want bool
	}{
		{store.Position{Epoch: 200, Seq: 51}, true},
		{store.Position{Epoch: 200, Seq: 50}, false},
		{store.Position{Epoch: 200, Seq: 49}, false},
		{store.Position{Epoch: 300, Seq: 1}, true},
		{store.Position{Epoch: 100, Seq: 1}, true}, // created again, its clock set back
	} {
		if got := moved(c.p, old); got != c.want {
			t.Errorf("moved(%+v, %+v) = %v, want %v", c.p, old, got, c.want)
		}
	}
}
