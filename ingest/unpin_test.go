package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/streams"
)

// everyPartition owns every partition, and has seen the fleet from the
// start.
type everyPartition struct{}

var _ ingest.Owner = everyPartition{}

func (everyPartition) Owned(n int) []int {
	ps := make([]int, n)
	for p := range ps {
		ps[p] = p
	}
	return ps
}
func (everyPartition) Changed() <-chan struct{} { return nil }
func (everyPartition) Settled() bool            { return true }

// stopParts is a partitioned consumer that owns all of its partitions,
// each of which has delivered it a message it holds.
type stopParts struct {
	ns     *server.Server
	logs   *observer.ObservedLogs
	stop   context.CancelFunc // ends Run's context: it drains and unpins
	cut    context.CancelFunc // ends its limit (RunWithin)
	done   chan error
	layout streams.Layout
}

// startClaimed starts a consumer of 16 partitions with the given drain
// timeout and returns once every partition has delivered it a message, so
// that every lane holds its partition's pin.
func startClaimed(t *testing.T, drain time.Duration) *stopParts {
	t.Helper()
	l := streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: 16}
	ns := testenv.NATSMapped(t, testenv.Partitioned(l))
	js, err := jetstream.New(testenv.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := streams.Ensure(ctx, js, l, streams.Options{MaxAge: time.Hour, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	log := zaptest.NewLogger(t, zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, core) })))
	m := ingest.NewMetrics(prometheus.NewRegistry())
	nc, err := ingest.Connect(ns.ClientURL(), log, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sink := &holdingSink{counts: map[string]int64{}}
	c, err := ingest.NewJetStreamConsumer(nc, ingest.Config{
		Subject: "mentions.>", DeadLetterSubject: "hotcount.dlq", DrainTimeout: drain,
		Limits: ingest.Limits{MaxCount: 100, MaxTopicBytes: 32},
	}, ingest.JetStreamConfig{Stream: "MENTIONS", Consumer: "hotcount", AckWait: time.Minute, MaxAckPending: 1000,
		Partitions: l.Partitions, Owner: everyPartition{}}, sink, func() bool { return false }, log, m)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	limit, cut := context.WithCancel(ctx)
	fx := &stopParts{ns: ns, logs: logs, stop: stop, cut: cut, done: make(chan error, 1), layout: l}
	go func() { fx.done <- c.RunWithin(runCtx, limit) }()
	t.Cleanup(func() { stop(); cut(); <-fx.done })

	// One topic of each partition, published as producers do: the
	// server's mapping routes it.
	topics := map[int]string{}
	for i := 0; len(topics) < l.Partitions; i++ {
		topic := fmt.Sprintf("t%d", i)
		if p := l.Of("mentions." + topic); topics[p] == "" {
			topics[p] = topic
		}
	}
	for _, topic := range topics {
		if _, err := js.Publish(ctx, "mentions."+topic, nil); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		for p, topic := range topics {
			if sink.count(topic) != 1 {
				return fmt.Errorf("partition %d has not delivered %s yet", p, topic)
			}
		}
		return nil
	})
	return fx
}

// silenceJetStream has JetStream stop answering while core NATS keeps
// going, as in a cluster that lost its JetStream leaders: the consumer's
// drain completes, and its requests to the JetStream API reach a
// subscriber that never replies, so each waits out its bound. It returns
// what that subscriber has been asked, and a channel closed at the first
// consumer info request.
func (fx *stopParts) silenceJetStream(t *testing.T) (asked func() []string, firstInfo <-chan struct{}) {
	t.Helper()
	if err := fx.ns.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var subjects []string
	first := make(chan struct{})
	var once sync.Once
	nc := testenv.Connect(t, fx.ns.ClientURL())
	if _, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		mu.Lock()
		subjects = append(subjects, m.Subject)
		mu.Unlock()
		if strings.HasPrefix(m.Subject, "$JS.API.CONSUMER.INFO.") {
			once.Do(func() { close(first) })
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), subjects...)
	}, first
}

// returned waits for Run to return, at most long (a bound on a failing
// test, not a wait the test relies on).
func (fx *stopParts) returned(t *testing.T, long time.Duration) error {
	t.Helper()
	select {
	case err := <-fx.done:
		fx.done <- err // for the cleanup
		return err
	case <-time.After(long):
		t.Fatalf("Run has not returned %s after its context ended", long)
		return nil
	}
}

// notUnpinned is how many partitions the consumer logged it could not
// unpin in time, and why.
func (fx *stopParts) notUnpinned() (n int64, why string) {
	for _, e := range fx.logs.FilterMessage("partitions not unpinned in time: their next owners wait for the pins to lapse").All() {
		m := e.ContextMap()
		n, _ = m["partitions"].(int64)
		why, _ = m["error"].(string)
	}
	return n, why
}

// infoAsked counts the consumer info requests among subjects, by
// partition stream.
func infoAsked(l streams.Layout, subjects []string) (each map[string]int) {
	each = map[string]int{}
	for _, s := range subjects {
		for p := range l.Partitions {
			if s == "$JS.API.CONSUMER.INFO."+l.Name(p)+".hotcount" {
				each[l.Name(p)]++
			}
		}
	}
	return each
}

// TestPartitionStopOnSilentJetStream: 16 claimed partitions, then
// JetStream stops answering (core NATS still up) and the consumer is
// stopped. The drain completes; the unpins that follow are sent all at
// once under one bound, so Run returns in about that bound (2 s) plus the
// drain, where one unpin after another, 2 s per request, took 16 × 2 s
// and more: past the shutdown's whole budget.
func TestPartitionStopOnSilentJetStream(t *testing.T) {
	fx := startClaimed(t, time.Second)
	asked, _ := fx.silenceJetStream(t)
	began := time.Now()
	fx.stop()
	err := fx.returned(t, time.Minute)
	took := time.Since(began)
	if err != nil {
		t.Errorf("Run = %v, want nil: the drain needs only core NATS", err)
	}
	if took > 6*time.Second {
		t.Errorf("Run returned %s after its context ended, want the drain and one unpin bound (2 s), well under 16 × 2 s", took)
	}
	// Every partition's unpin was attempted, and each waited out the
	// shared bound.
	if each := infoAsked(fx.layout, asked()); len(each) != fx.layout.Partitions {
		t.Errorf("consumer info asked for %d partitions (%v), want all %d", len(each), each, fx.layout.Partitions)
	}
	if n, why := fx.notUnpinned(); n != int64(fx.layout.Partitions) || !strings.Contains(why, "deadline exceeded") {
		t.Errorf("logged %d partitions not unpinned (%q), want all %d, at the unpins' bound", n, why, fx.layout.Partitions)
	}
}

// TestPartitionStopWithNATSGone: 16 claimed partitions, then the NATS
// server shuts down and the consumer is stopped: Run returns within the
// drain timeout and the unpins' bound, whatever waits on the server.
// (With nats.go 1.55 the drain cannot complete without the server: it
// flushes the connection first, so it ends at the drain timeout and the
// unpins are not tried. TestPartitionStopOnSilentJetStream is the case
// where they are.)
func TestPartitionStopWithNATSGone(t *testing.T) {
	fx := startClaimed(t, time.Second)
	fx.ns.Shutdown()
	fx.ns.WaitForShutdown()
	began := time.Now()
	fx.stop()
	err := fx.returned(t, time.Minute)
	if took := time.Since(began); took > 6*time.Second {
		t.Errorf("Run returned %s after its context ended (%v), want within the drain timeout (1 s) and the unpins' bound (2 s)", took, err)
	}
	t.Logf("Run = %v", err)
}

// TestPartitionStopCut: a stopped consumer whose drain or unpins wait on
// NATS returns promptly once its limit ends (the shutdown ends it at the
// final flush's deadline), well before its own bounds would end them.
func TestPartitionStopCut(t *testing.T) {
	t.Run("unpins", func(t *testing.T) {
		fx := startClaimed(t, time.Second)
		_, firstInfo := fx.silenceJetStream(t)
		fx.stop()
		<-firstInfo // the unpins are waiting on JetStream
		cut := time.Now()
		fx.cut()
		if err := fx.returned(t, time.Minute); err != nil {
			t.Errorf("Run = %v, want nil: the drain had completed", err)
		}
		if took := time.Since(cut); took > time.Second {
			t.Errorf("Run returned %s after the cut, want at once (the unpins' own bound is 2 s)", took)
		}
		if n, why := fx.notUnpinned(); n != int64(fx.layout.Partitions) || !strings.Contains(why, "canceled") {
			t.Errorf("logged %d partitions not unpinned (%q), want all %d, cut off", n, why, fx.layout.Partitions)
		}
	})
	t.Run("drain", func(t *testing.T) {
		// A drain timeout longer than any wait of the test: only the cut
		// can end the drain in time.
		fx := startClaimed(t, time.Minute)
		fx.ns.Shutdown()
		fx.ns.WaitForShutdown()
		fx.stop()
		cut := time.Now()
		fx.cut()
		err := fx.returned(t, time.Minute)
		if took := time.Since(cut); took > time.Second {
			t.Errorf("Run returned %s after the cut (%v), want at once", took, err)
		}
		if err == nil || !strings.Contains(err.Error(), "cut off") {
			t.Errorf("Run = %v, want the drain cut off", err)
		}
	})
}
