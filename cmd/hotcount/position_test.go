package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// The position engine through the binary.

// TestFrozenSidecarCountsOnce is the frozen sidecar of the position
// issue, with the binary: two `hotcount run`
// share the stream while mentions arrive; the one reading is stopped
// with SIGSTOP (a long GC or VM pause, a node cut off) with a window read
// and not written, the other takes its partitions over and writes them,
// and the frozen one is woken and writes its window too. The table ends
// with every mention once, in totals and buckets. With the journal this
// counted 959 of 60,000 twice (jetstream) and 1,045 (partitioned).
func TestFrozenSidecarCountsOnce(t *testing.T) {
	for _, mode := range []string{"jetstream", "partitioned"} {
		t.Run(mode, func(t *testing.T) { faultRun(t, mode, freeze) })
	}
}

// TestSplitSidecarCountsOnce is the frozen sidecar's case with the
// sidecar awake and cut off from NATS (a network split), in partitioned
// mode: while cut, it keeps writing what it had read to the table, and
// cannot store its checkpoint; the other takes its partitions over from
// the last checkpoint it stored and reads the same mentions again. Healed,
// both read on. Every mention counts once.
func TestSplitSidecarCountsOnce(t *testing.T) { faultRun(t, "partitioned", split) }

// A fault faultRun puts between one sidecar and the rest.
type fault int

const (
	freeze fault = iota // SIGSTOP, then SIGCONT
	split               // its NATS connection cut, then healed
)

func faultRun(t *testing.T, mode string, f fault) {
	l := streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: 4}
	args := []string{"--nats-mode", mode, "--flush-interval", "300ms",
		"--log-level", "warn", "--windows", "1m,1h"}
	var url string
	if mode == "partitioned" {
		ns := testenv.NATSMapped(t, testenv.Partitioned(l))
		url = ns.ClientURL()
		js, err := jetstream.New(testenv.Connect(t, url))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := streams.Ensure(context.Background(), js, l, streams.Options{MaxAge: time.Hour, MaxBytes: 1 << 30, Duplicates: time.Minute}); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--partitions", fmt.Sprint(l.Partitions))
	} else {
		ns := testenv.NATS(t)
		url = ns.ClientURL()
		if _, err := ingest.EnsureStream(context.Background(), testenv.Connect(t, url), "MENTIONS", "mentions.>", time.Minute); err != nil {
			t.Fatal(err)
		}
		l.Partitions = 1
	}
	nc := testenv.Connect(t, url)
	d := testenv.StartDynalite(t)
	table := d.Table(t, "frozen")
	testenv.AWSEnv(t)
	args = append(args, "--dynamodb-endpoint", d.Endpoint, "--table", table)
	// Each sidecar reaches NATS through a proxy a split can cut: which of
	// the two owns partitions is the fleet's hash of their ids, and one of
	// them may own all four (1 run in 8).
	var kids []*child
	var cuts []*testenv.Split
	for range 2 {
		cuts = append(cuts, testenv.NewSplit(t, strings.TrimPrefix(url, "nats://")))
		kids = append(kids, startChild(t, append(args, "--nats-url", "nats://"+cuts[len(cuts)-1].Addr())...))
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rep loadgen.Report
		err error
	}
	sent := make(chan result, 1)
	go func() {
		rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 40, Rate: 1_000, Messages: 16_000, Count: 1, Seed: 7, JetStream: true})
		sent <- result{rep, err}
	}()
	// Freeze a sidecar that reads and has written (its window holds what
	// it read since its last flush), or cut it off from NATS.
	var frozen, other *child
	var cut *testenv.Split
	testenv.Eventually(t, 60*time.Second, func() error {
		for i, c := range kids {
			if c.metric(t, "hotcount_ingest_partitions_owned") > 0 && c.metric(t, "hotcount_flusher_flushed_mentions_total") > 0 {
				frozen, other, cut = c, kids[1-i], cuts[i]
				return nil
			}
		}
		return fmt.Errorf("no sidecar that can be cut off has read and written yet")
	})
	switch f {
	case freeze:
		if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	case split:
		cut.Cut()
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := other.metric(t, "hotcount_ingest_partitions_owned"); n != float64(l.Partitions) {
			return fmt.Errorf("the other reads %v of %d partitions", n, l.Partitions)
		}
		return nil
	})
	// The other writes what the frozen one holds, meanwhile: the fault
	// lasts until it has written 2,000 more mentions (about 2 s of the
	// load), which is the test's point.
	since := other.metric(t, "hotcount_flusher_flushed_mentions_total")
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := other.metric(t, "hotcount_flusher_flushed_mentions_total") - since; n < 2_000 {
			return fmt.Errorf("the other wrote %v mentions since the fault, want 2,000", n)
		}
		return nil
	})
	switch f {
	case freeze:
		if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	case split:
		cut.Heal()
	}
	r := <-sent
	if r.err != nil {
		t.Fatal(r.err)
	}
	exact := tableHolds(t, d, table, r.rep.PerTopic)
	testenv.Eventually(t, 60*time.Second, exact)
	// Refused by what the other wrote: the woken sidecar's writes of what
	// it held (freeze); the other's of what the cut one wrote after its
	// last checkpoint (split).
	// (split: the cut one cannot store its high-water mark, so it writes
	// nothing while cut; healed, it writes what it held, refused by what
	// the other wrote, or the other's writes are refused by what it wrote
	// just before the cut.)
	refusers := []*child{frozen}
	if f == split {
		refusers = kids
	}
	var refused float64
	for _, c := range refusers {
		refused += c.metric(t, `hotcount_durable_writes_total{outcome="covered"}`) +
			c.metric(t, `hotcount_durable_writes_total{outcome="overlap"}`)
	}
	for _, c := range kids {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("SIGTERM: %v\n%s", err, c.logs)
		}
	}
	if err := exact(); err != nil {
		t.Fatal(err)
	}
	exactBuckets(t, d, table, r.rep.PerTopic)
	t.Logf("%s: %d mentions exact; %v writes refused (covered or overlapping) by what the other sidecar had written", mode, r.rep.Mentions, refused)
	if refused == 0 {
		t.Error("no write was refused by what the other sidecar wrote: the two never read the same mentions, and the fault proved nothing")
	}
}

// TestSIGKILLPositionLosesNothing: in jetstream mode, five SIGKILLs at
// random moments of the flushes, against a store slowed to 200 ms a call, each followed by a
// new process that starts from the checkpoint. Whatever a killed process
// had written, its successor's writes of the same mentions are refused
// by position; whatever it had not, the successor reads again.
func TestSIGKILLPositionLosesNothing(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	if _, err := ingest.EnsureStream(context.Background(), nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "kills")
	testenv.AWSEnv(t)
	slow := ddbfault.New(ddbfault.Config{Upstream: d.Endpoint})
	slow.SetLatency(200 * time.Millisecond)
	endpoint, stop, err := slow.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop() //nolint:errcheck // test teardown
	args := []string{"--nats-mode", "jetstream", "--nats-url", ns.ClientURL(),
		"--dynamodb-endpoint", endpoint, "--table", table, "--flush-interval", "300ms", "--log-level", "warn", "--windows", "1m,1h"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rep loadgen.Report
		err error
	}
	sent := make(chan result, 1)
	var published atomic.Bool
	go func() {
		rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 100, Zipf: 1.2, Rate: 2_000, Messages: 40_000, Count: 1, Seed: 11, JetStream: true})
		published.Store(true)
		sent <- result{rep, err}
	}()
	rng := rand.New(rand.NewPCG(11, uint64(time.Now().UnixNano())))
	cur := startChild(t, args...)
	const kills = 5
	for i := range kills {
		// Once it is writing (a successor started after the last
		// publish may find everything below its checkpoint written, and
		// nothing to write: it is killed all the same).
		testenv.Eventually(t, 30*time.Second, func() error {
			var n float64
			for _, o := range []string{"applied", "covered", "overlap", "in_doubt", "failed"} {
				n += cur.metric(t, `hotcount_durable_writes_total{outcome="`+o+`"}`)
			}
			if n == 0 && !published.Load() {
				return fmt.Errorf("no write sent yet (kill %d)", i+1)
			}
			return nil
		})
		// A random moment of the next flushes: the point of the test is
		// the wait.
		time.Sleep(time.Duration(rng.Int64N(int64(900 * time.Millisecond))))
		if err := cur.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cur.cmd.Wait() //nolint:errcheck // killed: its error says so
		cur = startChild(t, args...)
	}
	r := <-sent
	if r.err != nil {
		t.Fatal(r.err)
	}
	exact := tableHolds(t, d, table, r.rep.PerTopic)
	testenv.Eventually(t, 2*time.Minute, exact)
	if err := cur.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cur.cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, cur.logs)
	}
	if err := exact(); err != nil {
		t.Fatal(err)
	}
	exactBuckets(t, d, table, r.rep.PerTopic)
	t.Logf("%d SIGKILLs: %d mentions, every one once", kills, r.rep.Mentions)
}

// TestPositionClusterLosesNothing runs three `hotcount run` against a
// 3-node NATS cluster, streams at
// R3 (`hotcount stream create --replicas 3`), in both layouts, while a
// producer on package client publishes. Mid-load the node leading the
// (first partition's) stream goes, taking with it the readers' consumers
// there, and a sidecar that reads is SIGKILLed; both come back. The table
// ends with exactly what the streams stored, topic by topic, and every
// acknowledged mention is stored.
func TestPositionClusterLosesNothing(t *testing.T) {
	for _, mode := range []string{"jetstream", "partitioned"} {
		t.Run(mode, func(t *testing.T) { positionCluster(t, mode) })
	}
}

func positionCluster(t *testing.T, mode string) {
	layout := streams.Layout{Stream: "MENTIONS", Subject: "mentions.>"}
	create := []string{"stream", "create", "--replicas", "3"}
	args := []string{"--nats-mode", mode, "--flush-interval", "300ms", "--log-level", "warn"}
	var mappings map[string]string
	first := layout.Stream
	if mode == "partitioned" {
		layout.Partitions = 8
		mappings, first = testenv.Partitioned(layout), layout.Name(0)
		n := strconv.Itoa(layout.Partitions)
		create, args = append(create, "--partitions", n), append(args, "--partitions", n)
	}
	cl := testenv.NATSCluster(t, 3, mappings)
	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	var out strings.Builder
	testenv.Eventually(t, time.Minute, func() error {
		out.Reset()
		return dispatch(ctx, append(create, "--nats-url", cl.URLs()), nil, &out, &out)
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "cluster")
	testenv.AWSEnv(t)
	args = append(args, "--nats-url", cl.URLs(), "--dynamodb-endpoint", d.Endpoint, "--table", table)
	fleet := []*child{startChild(t, args...), startChild(t, args...), startChild(t, args...)}
	reading := func() error {
		var n float64
		for _, c := range fleet {
			n += c.metric(t, "hotcount_ingest_partitions_owned")
		}
		if want := max(layout.Partitions, 1); n != float64(want) {
			return fmt.Errorf("the fleet reads %v of %d partitions", n, want)
		}
		return nil
	}
	testenv.Eventually(t, 30*time.Second, reading)

	prod := produce(t, nc)
	prod.flowing(0, 2_000, "before the faults")
	testenv.Eventually(t, time.Minute, func() error { // every partition is being read, from its start
		var n float64
		for _, c := range fleet {
			n += c.metric(t, "hotcount_flusher_flushed_mentions_total")
		}
		if n < 1_000 {
			return fmt.Errorf("the fleet has written %v mentions", n)
		}
		return nil
	})
	for i, c := range fleet { // stream create's probes, deleted at the streams' front, are no loss
		if n := c.metric(t, "hotcount_durable_retention_lost_total"); n != 0 {
			t.Errorf("sidecar %d: hotcount_durable_retention_lost_total %v with nothing lost\n%s", i, n, c.logs)
		}
	}
	s, err := js.Stream(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream info: %v", err)
	}
	node := cl.Node(info.Cluster.Leader)
	victim := -1
	for i, c := range fleet {
		if c.metric(t, "hotcount_ingest_partitions_owned") > 0 {
			victim = i
		}
	}
	t.Logf("SIGKILLing sidecar %d and stopping NATS node %d (%s, %s's leader)", victim, node, cl.Name(node), first)
	if err := fleet[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cl.Stop(node)
	fleet[victim].cmd.Wait() //nolint:errcheck // killed
	prod.flowing(prod.total(), 6_000, "with a node and a sidecar down")
	cl.Start(node)
	fleet[victim] = startChild(t, args...)
	prod.flowing(prod.total(), 6_000, "after the restarts")
	acked := prod.finish(ctx)
	testenv.Eventually(t, time.Minute, reading)

	stored := storedMentions(t, js, layout)
	for topic, n := range acked {
		if stored[topic] < n {
			t.Errorf("topic %s: the streams stored %d, the producer was acknowledged %d", topic, stored[topic], n)
		}
	}
	exact := tableHolds(t, d, table, stored)
	if err := testenv.Poll(2*time.Minute, exact); err != nil {
		var logs strings.Builder
		for i, c := range fleet {
			fmt.Fprintf(&logs, "--- sidecar %d:\n%s", i, c.logs)
		}
		t.Fatalf("%v\n%s", err, logs.String())
	}
	for _, c := range fleet {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("SIGTERM: %v\n%s", err, c.logs)
		}
	}
	if err := exact(); err != nil {
		t.Fatal(err)
	}
	{ // stream status sees every stream checkpointed at its end
		status := []string{"stream", "status", "--json", "--nats-url", cl.URLs(), "--nats-mode", mode}
		if mode == "partitioned" {
			status = append(status, "--partitions", strconv.Itoa(layout.Partitions))
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			out.Reset()
			if err := dispatch(ctx, status, nil, &out, &out); err != nil {
				return fmt.Errorf("stream status: %v\n%s", err, out.String())
			}
			var ps []struct {
				Stream     string `json:"stream"`
				LastSeq    uint64 `json:"last_sequence"`
				Unwritten  uint64 `json:"unwritten"`
				Checkpoint *struct {
					Seq uint64 `json:"sequence"`
				} `json:"checkpoint"`
			}
			if err := json.Unmarshal([]byte(out.String()), &ps); err != nil {
				return fmt.Errorf("stream status --json: %v\n%s", err, out.String())
			}
			for _, p := range ps {
				if p.Checkpoint == nil || p.Checkpoint.Seq != p.LastSeq || p.Unwritten != 0 {
					return fmt.Errorf("%s: checkpoint %+v, %d unwritten, last sequence %d", p.Stream, p.Checkpoint, p.Unwritten, p.LastSeq)
				}
			}
			return nil
		})
	}
	var total int64
	for _, n := range stored {
		total += n
	}
	t.Logf("%s: lost %s's leader and a reading sidecar: %d mentions stored, every one counted once", mode, first, total)
}

// tableHolds returns a check that table holds exactly want, topic by
// topic: it fails the test at once on a topic that holds more (a
// mention counted twice), and reports what is still missing.
func tableHolds(t *testing.T, d *testenv.Dynalite, table string, want map[string]int64) func() error {
	return func() error {
		got, _ := d.Counts(t, table)
		for topic, n := range got {
			if n > want[topic] {
				t.Fatalf("%s: table %d, want %d: counted twice", topic, n, want[topic])
			}
		}
		for topic, n := range want {
			if got[topic] != n {
				return fmt.Errorf("%s: table %d, want %d", topic, got[topic], n)
			}
		}
		return nil
	}
}
