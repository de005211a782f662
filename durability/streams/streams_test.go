package streams_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

var layout = streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: 8}

var opts = streams.Options{MaxAge: time.Hour, MaxBytes: 64 << 20, Duplicates: time.Minute, Replicas: 1}

func jetStream(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(testenv.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestOfIsTheServersPartition: producers' subjects, topics with dots
// among them, land in the stream Of names, on a server with the mapping.
func TestOfIsTheServersPartition(t *testing.T) {
	ns := testenv.NATSMapped(t, testenv.Partitioned(layout))
	js := jetStream(t, ns.ClientURL())
	ctx := context.Background()
	if _, err := streams.Ensure(ctx, js, layout, opts); err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for i := range 200 {
		subject := fmt.Sprintf("mentions.topic-%d.with.dots", i)
		ack, err := js.Publish(ctx, subject, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := layout.Of(subject)
		if ack.Stream != layout.Name(p) {
			t.Fatalf("%s stored by %s, Of says partition %d", subject, ack.Stream, p)
		}
		seen[p] = true
		// Stored with the partition first; Unstored gives the producer's.
		m, err := js.Stream(ctx, ack.Stream)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := m.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		if got := streams.Unstored(raw.Subject); got != subject {
			t.Fatalf("stored as %s, unstored %s, published %s", raw.Subject, got, subject)
		}
	}
	if len(seen) != layout.Partitions {
		t.Errorf("200 topics fell in %d of %d partitions", len(seen), layout.Partitions)
	}
}

func TestProbe(t *testing.T) {
	ctx := context.Background()
	t.Run("mapped", func(t *testing.T) {
		ns := testenv.NATSMapped(t, testenv.Partitioned(layout))
		js := jetStream(t, ns.ClientURL())
		if _, err := streams.Ensure(ctx, js, layout, opts); err != nil {
			t.Fatal(err)
		}
		if _, err := streams.Probe(ctx, js, layout); err != nil {
			t.Fatal(err)
		}
		if err := streams.Check(ctx, js, layout); err != nil {
			t.Fatal(err)
		}
		// The probes are gone again.
		ps, err := streams.Status(ctx, js, layout.Names())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Msgs != 0 {
				t.Errorf("%s holds %d messages after the probe", p.Stream, p.Msgs)
			}
		}
	})
	t.Run("no mapping", func(t *testing.T) {
		ns := testenv.NATS(t)
		js := jetStream(t, ns.ClientURL())
		if _, err := streams.Ensure(ctx, js, layout, opts); err != nil {
			t.Fatal(err)
		}
		// The previous release's stream still takes mentions.> (a
		// migration's first step): the probe must not land there, where
		// that release's sidecars would count it.
		old, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = streams.Probe(ctx, js, layout)
		if !errors.Is(err, streams.ErrMisrouted) {
			t.Fatalf("probe without the mapping: %v, want ErrMisrouted", err)
		}
		info, err := old.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 0 {
			t.Errorf("the probe left %d messages in the stream that takes mentions.> itself", info.State.Msgs)
		}
	})
	t.Run("other partition count", func(t *testing.T) {
		ns := testenv.NATSMapped(t, testenv.Partitioned(streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: 4}))
		js := jetStream(t, ns.ClientURL())
		if _, err := streams.Ensure(ctx, js, layout, opts); err != nil {
			t.Fatal(err)
		}
		if _, err := streams.Probe(ctx, js, layout); !errors.Is(err, streams.ErrMisrouted) {
			t.Fatalf("probe against a mapping into 4 partitions: %v, want ErrMisrouted", err)
		}
	})
}

func TestCheck(t *testing.T) {
	ctx := context.Background()
	ns := testenv.NATS(t)
	js := jetStream(t, ns.ClientURL())
	if err := streams.Check(ctx, js, layout); !errors.Is(err, streams.ErrMissing) {
		t.Fatalf("no streams: %v", err)
	}
	// The previous release's layout: one stream with a partitioning
	// transform.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: "mentions.>", Destination: "{{partition(8)}}.mentions.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := streams.Check(ctx, js, layout); !errors.Is(err, streams.ErrLegacy) {
		t.Fatalf("legacy stream: %v", err)
	}
	if _, err := streams.Ensure(ctx, js, layout, opts); err != nil {
		t.Fatal(err)
	}
	if err := streams.Check(ctx, js, layout); err != nil {
		t.Fatal(err)
	}
	// Made for more partitions than the sidecars are told.
	if err := streams.Check(ctx, js, streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: 4}); !errors.Is(err, streams.ErrTooMany) {
		t.Fatalf("more streams than partitions: %v", err)
	}
	// A stream of the name that is not the partition's.
	other := streams.Layout{Stream: "MENTIONS", Subject: "other.>", Partitions: 8}
	if _, err := streams.Ensure(ctx, js, other, opts); !errors.Is(err, streams.ErrNotPartition) {
		t.Fatalf("Ensure over another layout's streams: %v", err)
	}
}

func TestPosition(t *testing.T) {
	for _, c := range []struct {
		p   int
		seq uint64
	}{{0, 0}, {0, 1}, {1, 1}, {1023, 1<<48 - 1}, {5, 123456789}} {
		pos := streams.At(c.p, c.seq)
		if p, seq := streams.Split(pos); p != c.p || seq != c.seq || pos < 0 {
			t.Errorf("At(%d, %d) = %d, split %d, %d", c.p, c.seq, pos, p, seq)
		}
	}
	if streams.At(0, 42) != 42 {
		t.Error("partition 0's positions are not its stream sequences")
	}
	if !(streams.At(1, 1) > streams.At(0, 1<<47)) {
		t.Error("positions do not sort by partition first")
	}
}

// TestSpread: on a 3-node cluster, 8 R3 partition streams end with their
// leaders spread, at most 3 on a server, and Status shows it.
func TestSpread(t *testing.T) {
	cl := testenv.NATSCluster(t, 3, testenv.Partitioned(layout))
	nc := testenv.Connect(t, cl.URLs())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := opts
	o.Replicas = 3
	testenv.Eventually(t, time.Minute, func() error { _, err := streams.Ensure(ctx, js, layout, o); return err })
	// Crowd the leaders onto one server first, as a node's restart does.
	ps, err := streams.Status(ctx, js, layout.Names())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Leader != cl.Name(0) {
			if err := streams.StepDown(ctx, nc, p.Stream, cl.Name(0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.Eventually(t, time.Minute, func() error {
		ps, err := streams.Status(ctx, js, layout.Names())
		if err != nil {
			return err
		}
		if n := streams.Leaders(ps)[cl.Name(0)]; n != layout.Partitions {
			t.Logf("leaders %v", streams.Leaders(ps))
			return fmt.Errorf("%s leads %d of %d", cl.Name(0), n, layout.Partitions)
		}
		return nil
	})
	if _, err := streams.Spread(ctx, nc, js, layout, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ps, err = streams.Status(ctx, js, layout.Names())
	if err != nil {
		t.Fatal(err)
	}
	leaders := streams.Leaders(ps)
	for i := range 3 {
		if n := leaders[cl.Name(i)]; n > 3 || n < 2 {
			t.Errorf("after Spread %s leads %d of 8 partition streams (want 2 or 3): %v", cl.Name(i), n, leaders)
		}
	}
}
