package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/internal/ddbfault"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/streams"
)

// TestPartitionedClusterLosesNothing runs the fleet as deploy/README.md
// sets it up: a 3-node NATS cluster with partitioned mode's mapping (the
// one deploy/nats/hotcount.conf ships, deploy/nats_test.go holds it to
// it), `hotcount stream create --partitions 16 --replicas 3`, four
// `hotcount run --nats-mode partitioned --durable-engine journal` processes (the
// journal engine's run; TestPositionClusterLosesNothing is the default's) and a producer on
// package client publishing plain mentions.<topic>. The leaders are
// spread; the hottest topic is written about once per flush interval for
// the whole fleet. Mid-stream one NATS node goes (partition 0's stream
// leader in one run, a follower of it in the other; with the leaders
// spread, either leads other partitions) and one sidecar is SIGKILLed;
// both come back. The table ends with exactly what the streams
// acknowledged to the producer, topic by topic.
func TestPartitionedClusterLosesNothing(t *testing.T) {
	for _, lose := range []string{"leader", "follower"} {
		t.Run(lose, func(t *testing.T) { clusterRun(t, lose) })
	}
}

func clusterRun(t *testing.T, lose string) {
	const partitions, sidecars = 16, 4
	layout := streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: partitions}
	cl := testenv.NATSCluster(t, 3, testenv.Partitioned(layout))
	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	var out strings.Builder
	testenv.Eventually(t, time.Minute, func() error {
		out.Reset()
		return dispatch(ctx, []string{"stream", "create", "--nats-url", cl.URLs(), "--partitions", strconv.Itoa(partitions), "--replicas", "3"}, nil, &out, &out)
	})
	t.Logf("hotcount stream create:\n%s", out.String())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := streams.Status(ctx, js, layout, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // 16 streams over 3 servers: 5 or 6 each (at most one apart)
		if n := streams.Leaders(ps)[cl.Name(i)]; n < 5 || n > 6 {
			t.Errorf("%s leads %d of %d partition streams after stream create: %v", cl.Name(i), n, partitions, streams.Leaders(ps))
		}
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "cluster")
	testenv.AWSEnv(t)
	// The store behind a proxy that counts the writes to each key, and
	// does nothing else to them.
	counting := ddbfault.New(ddbfault.Config{Upstream: d.Endpoint})
	endpoint, stop, err := counting.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop() //nolint:errcheck // test teardown
	args := []string{"--nats-mode", "partitioned", "--durable-engine", "journal", "--partitions", strconv.Itoa(partitions), "--nats-url", cl.URLs(),
		"--dynamodb-endpoint", endpoint, "--table", table, "--flush-interval", "300ms", "--flush-timeout", "1s",
		"--ack-wait", "10s", "--log-level", "warn"}
	var fleet []*child
	for range sidecars {
		fleet = append(fleet, startChild(t, args...))
	}
	owned := func(cs []*child) error {
		var n float64
		for _, c := range cs {
			n += c.metric(t, "hotcount_ingest_partitions_owned")
		}
		if n != partitions {
			return fmt.Errorf("the fleet owns %v of %d partitions", n, partitions)
		}
		return nil
	}
	testenv.Eventually(t, 30*time.Second, func() error { return owned(fleet) })

	prod := produce(t, nc)
	ackedTotal, flowing := prod.total, prod.flowing
	flowing(0, 2_000, "before the faults")
	// The hottest topic (Zipf's first) over about 3 s of steady flow:
	// written about once per round of flushes by the whole fleet, where
	// four sidecars sharing one consumer would each write it in each of
	// their flushes, about four times a round.
	hotWrites := func() (n int) {
		for key, w := range counting.Stats().Writes {
			if strings.HasPrefix(key, "TREND#topic-0#") {
				n += w
			}
		}
		return n
	}
	flushes := func() []float64 {
		var n []float64
		for _, c := range fleet {
			n = append(n, c.metric(t, `hotcount_flusher_flushes_total{result="ok"}`))
		}
		return n
	}
	w0, f0, a0 := hotWrites(), flushes(), ackedTotal()
	flowing(a0, 6_000, "in steady flow")
	w1, f1 := hotWrites(), flushes()
	rounds := 0.0 // the flushes of the sidecar that flushed most
	for i := range f1 {
		rounds = max(rounds, f1[i]-f0[i])
	}
	perRound := float64(w1-w0) / rounds
	t.Logf("the hottest topic: %d writes in %v rounds of flushes, %.2f a round, for the fleet of %d", w1-w0, rounds, perRound, sidecars)
	if perRound > 1.5 {
		t.Errorf("the hottest topic is written %.2f times per round of flushes, want about once for the whole fleet", perRound)
	}
	s, err := js.Stream(ctx, layout.Name(0))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream info: %v", err)
	}
	node := cl.Node(info.Cluster.Leader)
	if lose == "follower" {
		node = cl.Node(info.Cluster.Replicas[0].Name)
	}
	t.Logf("SIGKILLing a sidecar that holds messages and stopping NATS node %d (%s, %s's %s)", node, cl.Name(node), layout.Name(0), lose)
	// The sidecar killed is one whose window holds unacknowledged
	// messages, so that the kill takes held messages with it (checked
	// below by the redeliveries): one that owns no partition yet, or is
	// between two flushes, may hold none.
	victim := -1
	testenv.Eventually(t, 10*time.Second, func() error {
		for i, c := range fleet {
			if c.metric(t, "hotcount_aggregator_held_messages") > 0 {
				victim = i
				return nil
			}
		}
		return errors.New("no sidecar holds a message")
	})
	if err := fleet[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cl.Stop(node)
	fleet[victim].cmd.Wait() //nolint:errcheck // killed
	// The fleet runs on without them for a while: about 4 s of mentions.
	flowing(ackedTotal(), 8_000, "with a node and a sidecar down")
	cl.Start(node)
	fleet[victim] = startChild(t, args...)
	testenv.Eventually(t, time.Minute, func() error { // the node back in the stream's group
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			return fmt.Errorf("stream cluster %+v, want a leader and 2 replicas", info.Cluster)
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("replica %s: current %v, offline %v", r.Name, r.Current, r.Offline)
			}
		}
		return nil
	})
	flowing(ackedTotal(), 8_000, "after the restarts")
	acked := prod.finish(ctx)

	// Everything acknowledged by the sidecars, the dead one's journal
	// replayed by the others.
	if err := testenv.Poll(90*time.Second, func() error { return owned(fleet) }); err != nil {
		var logs strings.Builder
		for i, c := range fleet {
			fmt.Fprintf(&logs, "--- sidecar %d:\n%s", i, c.logs)
		}
		t.Fatalf("%v\n%s", err, logs.String())
	}
	testenv.Eventually(t, 2*journal.Lease+time.Minute, func() error {
		for p := range partitions {
			c, err := js.Consumer(ctx, layout.Name(p), "hotcount")
			if err != nil {
				return err
			}
			ci, err := c.Info(ctx)
			if err != nil {
				return err
			}
			if ci.NumPending != 0 || ci.NumAckPending != 0 {
				return fmt.Errorf("partition %d: %d pending, %d unacknowledged", p, ci.NumPending, ci.NumAckPending)
			}
		}
		if open, err := openJournalEntries(nc, journal.PartitionsBucket); err != nil || open > 0 {
			return fmt.Errorf("%d journal entries not yet replayed (%v)", open, err)
		}
		return nil
	})
	var redelivered, journaled float64
	for _, c := range fleet { // the survivors and the killed one's successor
		redelivered += c.metric(t, "hotcount_ingest_redelivered_total")
		journaled += c.metric(t, "hotcount_ingest_journaled_redeliveries_total")
	}
	if redelivered == 0 {
		t.Error("nothing was redelivered: the SIGKILL took no held message with it, and the test proves less than it says")
	}
	for _, c := range fleet {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("SIGTERM: %v\n%s", err, c.logs)
		}
	}

	// What the streams stored, topic by topic, read message by message:
	// the table must hold exactly that. A producer's publish retried
	// across a stream leader's loss can be stored twice (the first copy
	// landed, its acknowledgement was lost, and the new leader's
	// de-duplication missed it): such a mention is in a stream twice and
	// rightly counted twice. So the table is held to the streams, and the
	// streams to the producer: every acknowledged mention stored.
	stored := storedMentions(t, js, layout)
	got, _ := d.Counts(t, table)
	var total, want, inStreams int64
	for topic, n := range stored {
		inStreams += n
		if got[topic] != n {
			t.Errorf("topic %s: table %d, the streams stored %d", topic, got[topic], n)
		}
	}
	for topic, n := range acked {
		want += n
		if stored[topic] < n {
			t.Errorf("topic %s: the streams stored %d, the producer was acknowledged %d: acknowledged mentions lost", topic, stored[topic], n)
		}
	}
	for _, n := range got {
		total += n
	}
	t.Logf("lost the %s: acknowledged %d mentions over %d topics, the streams stored %d (%d stored twice), table %d; the survivors took %v redeliveries, %v of them already journaled",
		lose, want, len(acked), inStreams, inStreams-want, total, redelivered, journaled)
	if total != inStreams {
		t.Errorf("table holds %d mentions, the streams stored %d", total, inStreams)
	}
}

// storedMentions reads every message of the partition streams, one by
// one, and counts the mentions by topic (probes left out), as
// the sidecars read their payloads.
func storedMentions(t *testing.T, js jetstream.JetStream, l streams.Layout) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	names := []string{l.Stream} // jetstream mode's one stream: Partitions 0
	if l.Partitions > 0 {
		names = names[:0]
		for p := range l.Partitions {
			names = append(names, l.Name(p))
		}
	}
	for _, name := range names {
		// A minute for each stream's thousands of requests: the machine
		// may be busy (one minute for all 16 ran out once).
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		st := s.CachedInfo().State
		for seq := st.FirstSeq; st.Msgs > 0 && seq <= st.LastSeq; seq++ {
			msg, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // a probe, deleted
			}
			if err != nil {
				t.Fatalf("%s: message %d: %v", name, seq, err)
			}
			if msg.Header.Get(streams.ProbeHeader) != "" {
				continue
			}
			pl, err := ingest.ParsePayload(msg.Data, math.MaxInt32)
			if err != nil {
				t.Fatalf("%s: a stored message the sidecars would refuse: %v", name, err)
			}
			subject := msg.Subject
			if l.Partitions > 0 {
				subject = streams.Unstored(subject)
			}
			out[strings.TrimPrefix(subject, "mentions.")] += pl.Count
		}
	}
	return out
}

// producer publishes about 2,000 mentions a second over 200 Zipf topics
// with package client, as an application would, and keeps what the
// streams acknowledged, topic by topic.
type producer struct {
	t      *testing.T
	pub    *client.Publisher
	mu     sync.Mutex
	acked  map[string]int64
	failed int
	stop   chan struct{}
	done   chan error
}

func produce(t *testing.T, nc *nats.Conn) *producer {
	t.Helper()
	p := &producer{t: t, acked: map[string]int64{}, stop: make(chan struct{}), done: make(chan error, 1)}
	pub, err := client.NewPublisher(nc, client.WithLinger(20*time.Millisecond), client.WithRetry(2*time.Second, time.Minute),
		client.WithOnDone(func(topic string, n int64, err error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if err != nil {
				p.failed++
				return
			}
			p.acked[topic] += n
		}))
	if err != nil {
		t.Fatal(err)
	}
	p.pub = pub
	go p.run()
	return p
}

func (p *producer) run() {
	rng := rand.New(rand.NewPCG(5, 5))
	zipf := rand.NewZipf(rng, 1.2, 1, 199)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			p.done <- nil
			return
		case <-tick.C:
		}
		for range 2 { // about 2,000 mentions a second
			if err := p.pub.Mention(context.Background(), "topic-"+strconv.FormatUint(zipf.Uint64(), 10), 1); err != nil {
				p.done <- err
				return
			}
		}
	}
}

// total is the mentions acknowledged so far.
func (p *producer) total() (n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.acked {
		n += v
	}
	return n
}

// flowing waits until the streams have acknowledged n more mentions than
// they had at from.
func (p *producer) flowing(from, n int64, what string) {
	p.t.Helper()
	testenv.Eventually(p.t, time.Minute, func() error {
		if got := p.total() - from; got < n {
			return fmt.Errorf("%s: %d of %d mentions acknowledged", what, got, n)
		}
		return nil
	})
}

// finish stops publishing, waits for the last acknowledgements, and
// returns what was acknowledged, topic by topic; a publish that failed
// after its retries fails the test.
func (p *producer) finish(ctx context.Context) map[string]int64 {
	p.t.Helper()
	close(p.stop)
	if err := <-p.done; err != nil {
		p.t.Fatal(err)
	}
	if err := p.pub.Close(ctx); err != nil {
		p.t.Fatalf("producer: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed > 0 {
		p.t.Fatalf("%d publishes failed after their retries", p.failed)
	}
	return p.acked
}
