package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// TestChaosCountsOnce is the position engine's faults all at once, with
// the binary, in partitioned mode: three `hotcount run`
// sidecars read four partition streams through a DynamoDB proxy that
// loses 15% of the counting writes' answers after the store applied them
// (a reset, a 500, a hang, a 200 cut short), while a producer publishes
// 36,000 mentions over 60 topics at 1,500/s. Mid-load a sidecar that
// reads and has written is frozen with SIGSTOP for 10 to 15 s (the others
// take its partitions over) and woken with its window unwritten; while it
// is frozen, another that reads is SIGKILLed at a random moment of its
// flushes and a new one started. Once the load is counted (the table
// holds it exactly, totals and buckets, and every stream is checkpointed
// at its end), the partition streams are deleted and created again under
// the running fleet (an operator's mistake, a restore from nothing), and
// 6,000 more mentions published over 80 topics: a recreated stream is
// another epoch, whose mentions count from its first sequence, not as
// already counted. The table ends with both loads, every mention once,
// topic by topic in totals and buckets; every sidecar alive stops cleanly
// on SIGTERM, leaving each new stream checkpointed at its end.
func TestChaosCountsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of SIGSTOP, SIGKILL, lost answers and recreated streams")
	}
	began := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: 4}
	ns := testenv.NATSMapped(t, testenv.Partitioned(l))
	url := ns.ClientURL()
	nc := testenv.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	opts := streams.Options{MaxAge: time.Hour, MaxBytes: 1 << 30, Duplicates: time.Minute}
	if _, err := streams.Ensure(ctx, js, l, opts); err != nil {
		t.Fatal(err)
	}
	names := make([]string, l.Partitions)
	for p := range names {
		names[p] = l.Name(p)
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "chaos")
	testenv.AWSEnv(t)
	proxy := ddbfault.New(ddbfault.Config{Upstream: d.Endpoint})
	proxy.SetHang(2 * time.Second) // past the write's own timeout would hold the test for nothing
	proxy.LoseAnswers(0.15)
	endpoint, stop, err := proxy.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop() //nolint:errcheck // test teardown
	args := []string{"--nats-mode", "partitioned", "--partitions", fmt.Sprint(l.Partitions),
		"--nats-url", url, "--dynamodb-endpoint", endpoint, "--table", table,
		"--flush-interval", "300ms", "--log-level", "warn", "--windows", "1m,1h"}

	fleet := []*child{startChild(t, args...), startChild(t, args...), startChild(t, args...)}
	everyone := append([]*child(nil), fleet...) // the killed one too, for the logs
	logs := func() string {
		var b strings.Builder
		for i, c := range everyone {
			fmt.Fprintf(&b, "--- sidecar %d (pid %d):\n%s", i, c.cmd.Process.Pid, c.logs)
		}
		return b.String()
	}
	defer func() {
		if t.Failed() {
			t.Logf("the sidecars' logs:\n%s", logs())
		}
	}()
	// sum adds metric over cs: never a frozen one, whose /metrics would
	// not answer.
	sum := func(metric string, cs ...*child) float64 {
		var n float64
		for _, c := range cs {
			n += c.metric(t, metric)
		}
		return n
	}
	writes := func(c *child) float64 {
		var n float64
		for _, o := range []string{"applied", "covered", "overlap", "in_doubt", "failed"} {
			n += c.metric(t, `hotcount_durable_writes_total{outcome="`+o+`"}`)
		}
		return n
	}
	readsAll := func(cs ...*child) func() error {
		return func() error {
			if n := sum("hotcount_ingest_partitions_owned", cs...); n != float64(l.Partitions) {
				return fmt.Errorf("the sidecars read %v of %d partitions", n, l.Partitions)
			}
			return nil
		}
	}
	testenv.Eventually(t, 30*time.Second, readsAll(fleet...))

	type result struct {
		rep loadgen.Report
		err error
	}
	sent := make(chan result, 1)
	go func() {
		rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 60, Zipf: 1.2, Rate: 1_500, Messages: 36_000, Count: 1, Seed: 23, JetStream: true})
		sent <- result{rep, err}
	}()
	rng := rand.New(rand.NewPCG(23, uint64(time.Now().UnixNano())))

	// Freeze a sidecar that reads and has written: its window holds what
	// it read since its last flush.
	frozen := -1
	testenv.Eventually(t, 60*time.Second, func() error {
		for i, c := range fleet {
			if c.metric(t, "hotcount_ingest_partitions_owned") > 0 && c.metric(t, "hotcount_flusher_flushed_mentions_total") > 0 {
				frozen = i
				return nil
			}
		}
		return fmt.Errorf("no sidecar has read and written yet")
	})
	hold := 10*time.Second + time.Duration(rng.Int64N(int64(5*time.Second)))
	if err := fleet[frozen].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozeAt := time.Now()
	var others []int
	for i := range fleet {
		if i != frozen {
			others = append(others, i)
		}
	}
	testenv.Eventually(t, 30*time.Second, readsAll(fleet[others[0]], fleet[others[1]]))
	t.Logf("sidecar %d frozen for %s; the other two read every partition after %s", frozen, hold.Round(time.Millisecond), time.Since(frozeAt).Round(time.Millisecond))

	// Meanwhile kill one of the others that reads, once it is writing, at
	// a random moment of its next flushes.
	victim := -1
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, i := range others {
			if fleet[i].metric(t, "hotcount_ingest_partitions_owned") > 0 && writes(fleet[i]) > 0 {
				victim = i
				return nil
			}
		}
		return fmt.Errorf("neither of the others reads and writes")
	})
	time.Sleep(time.Duration(rng.Int64N(int64(900 * time.Millisecond))))
	killed := fleet[victim]
	if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed.cmd.Wait() //nolint:errcheck // killed: checked below
	if ws, ok := killed.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("sidecar %d was to die of SIGKILL: %v", victim, killed.cmd.ProcessState)
	}
	select {
	case r := <-sent:
		sent <- r
		t.Logf("sidecar %d SIGKILLed after the load was published: not mid-load", victim)
	default:
		t.Logf("sidecar %d SIGKILLed mid-load, %s into the freeze", victim, time.Since(frozeAt).Round(time.Millisecond))
	}
	fleet[victim] = startChild(t, args...)
	everyone = append(everyone, fleet[victim])

	// Wake the frozen one when its time is up.
	time.Sleep(time.Until(frozeAt.Add(hold)))
	if err := fleet[frozen].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woke := "after the load was published"
	select {
	case r := <-sent:
		sent <- r
	default:
		woke = "mid-load"
	}
	t.Logf("sidecar %d woken %s, after %s", frozen, woke, time.Since(frozeAt).Round(time.Millisecond))

	first := <-sent
	if first.err != nil {
		t.Fatal(first.err)
	}
	if first.rep.Mentions < 30_000 {
		t.Fatalf("the stream took %d mentions of 36,000 (%d unacknowledged)", first.rep.Mentions, first.rep.Unacknowledged)
	}
	if err := testenv.Poll(60*time.Second, tableHolds(t, d, table, first.rep.PerTopic)); err != nil {
		t.Fatalf("first load: %v\n%s", err, items(t, d, table, first.rep.PerTopic))
	}
	totalsAt := time.Now()
	// Counted means the buckets too, which can lag the totals by seconds
	// (a bucket's write in doubt, or recounted, while its total's
	// landed), and every stream checkpointed at its end. The old
	// creation's writes still in flight would land all the same (their
	// own positions), but one that must be recounted cannot be once its
	// stream is gone: what a deleted stream holds unwritten may go with
	// it (docs/SEMANTICS.md, "A stream created again"), and this test
	// holds the fleet to zero loss.
	if err := testenv.Poll(30*time.Second, bucketsHold(t, d, table, first.rep.PerTopic)); err != nil {
		t.Fatalf("first load: the totals exact, not the buckets: %v\n%s", err, items(t, d, table, first.rep.PerTopic))
	}
	bucketsAt := time.Now()
	testenv.Checkpointed(t, url, names, 30*time.Second)
	lostFirst := proxy.Stats().Lost()
	t.Logf("first load: %d mentions exact at %s (the buckets %s after the totals, checkpointed %s after them); %d answers lost so far",
		first.rep.Mentions, totalsAt.Sub(began).Round(time.Millisecond), bucketsAt.Sub(totalsAt).Round(time.Millisecond),
		time.Since(bucketsAt).Round(time.Millisecond), lostFirst)

	// Delete the partition streams under the fleet and create them again.
	epochs := map[string]int64{}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		epochs[name] = s.CachedInfo().Created.UnixMicro()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	time.Sleep(time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))) // a random moment of the readers' retries
	created, err := streams.Ensure(ctx, js, l, opts)
	if err != nil {
		t.Fatal(err)
	}
	if created != l.Partitions {
		t.Fatalf("created %d partition streams again, want %d", created, l.Partitions)
	}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if e := s.CachedInfo().Created.UnixMicro(); e == epochs[name] {
			t.Fatalf("%s created again in the same epoch %d", name, e)
		}
	}
	second, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 80, Zipf: 1.2, Rate: 2_000, Messages: 6_000, Count: 1, Seed: 29, JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	if second.Mentions < 5_000 {
		t.Fatalf("the recreated streams took %d mentions of 6,000 (%d unacknowledged)", second.Mentions, second.Unacknowledged)
	}
	want := maps.Clone(first.rep.PerTopic)
	for topic, n := range second.PerTopic {
		want[topic] += n
	}
	exact := tableHolds(t, d, table, want)
	if err := testenv.Poll(60*time.Second, exact); err != nil {
		t.Fatalf("both loads: %v\n%s", err, items(t, d, table, want))
	}
	if err := testenv.Poll(30*time.Second, bucketsHold(t, d, table, want)); err != nil {
		t.Fatalf("both loads: the totals exact, not the buckets: %v\n%s", err, items(t, d, table, want))
	}
	testenv.Eventually(t, 30*time.Second, readsAll(fleet...))

	// What the faults did, from the sidecars' side.
	var inDoubt, refused, recounts float64
	for i, c := range fleet {
		if n := c.metric(t, "hotcount_durable_retention_lost_total"); n != 0 {
			t.Errorf("sidecar %d: hotcount_durable_retention_lost_total %v with nothing dropped\n%s", i, n, c.logs)
		}
		inDoubt += c.metric(t, `hotcount_durable_writes_total{outcome="in_doubt"}`)
		refused += c.metric(t, `hotcount_durable_writes_total{outcome="covered"}`) + c.metric(t, `hotcount_durable_writes_total{outcome="overlap"}`)
		recounts += c.metric(t, "hotcount_durable_recounts_total")
	}
	wokenRefused := fleet[frozen].metric(t, `hotcount_durable_writes_total{outcome="covered"}`) +
		fleet[frozen].metric(t, `hotcount_durable_writes_total{outcome="overlap"}`)

	for i, c := range fleet {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("sidecar %d, SIGTERM: %v\n%s", i, err, c.logs)
		}
	}
	if err := exact(); err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}
	exactBuckets(t, d, table, want)
	testenv.Checkpointed(t, url, names, 10*time.Second)

	stats := proxy.Stats()
	t.Logf("%d + %d mentions over %d topics, every one once, in %s: the proxy lost %d answers (%d after the streams were recreated: %v); the sidecars alive at the end saw %v writes in doubt (the SDK's retries settle most lost answers), %v refused as written (%v by the woken one), %v recounts",
		first.rep.Mentions, second.Mentions, len(want), time.Since(began).Round(time.Millisecond),
		stats.Lost(), stats.Lost()-lostFirst, stats.Did, inDoubt, refused, wokenRefused, recounts)
	if lostFirst == 0 {
		t.Error("no answer was lost during the first load: the test proves nothing of lost answers")
	}
	if stats.Lost() == lostFirst {
		t.Error("no answer was lost after the streams were recreated")
	}
}

// bucketsHold is tableHolds for the time buckets: a check that each
// granularity of table's buckets holds exactly want, topic by topic,
// failing the test at once on a topic that holds more.
func bucketsHold(t *testing.T, d *testenv.Dynalite, table string, want map[string]int64) func() error {
	return func() error {
		for g, per := range bucketSums(t, d, table) {
			for topic, n := range per {
				if n > want[topic] {
					t.Fatalf("%s: its %s buckets hold %d, want %d: counted twice", topic, g, n, want[topic])
				}
			}
			for topic, n := range want {
				if per[topic] != n {
					return fmt.Errorf("%s: its %s buckets hold %d, want %d", topic, g, per[topic], n)
				}
			}
		}
		return nil
	}
}

// items describes, for a failure, the items of each topic whose totals
// or buckets do not hold want: each item's key, count and recorded
// stream positions.
func items(t *testing.T, d *testenv.Dynalite, table string, want map[string]int64) string {
	per := map[string]map[string]int64{} // topic -> "total", "1m", "1h" -> count
	type item struct {
		pk   string
		rest []string
	}
	all := map[string][]item{}
	add := func(topic, kind string, n int64) {
		if per[topic] == nil {
			per[topic] = map[string]int64{}
		}
		per[topic][kind] += n
	}
	p := dynamodb.NewScanPaginator(d.Client(), &dynamodb.ScanInput{TableName: &table})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			return fmt.Sprintf("(scan: %v)", err)
		}
		for _, it := range page.Items {
			av, _ := it[schema.AttrPK].(*types.AttributeValueMemberS)
			if av == nil {
				continue
			}
			pk, topic, kind := av.Value, "", ""
			if tp, g, _, _, err := schema.ParseBucketKey(pk); err == nil {
				topic, kind = tp, g.String()
			} else if tp, _, err := schema.ParseShardKey(pk); err == nil {
				topic, kind = tp, "total"
			} else {
				continue
			}
			add(topic, kind, testenv.CountOf(t, it))
			var rest []string
			for name, v := range it {
				if n, ok := v.(*types.AttributeValueMemberN); ok && (name == schema.AttrCount || strings.HasPrefix(name, store.PositionPrefix)) {
					rest = append(rest, name+"="+n.Value)
				}
			}
			slices.Sort(rest)
			all[topic] = append(all[topic], item{pk, rest})
		}
	}
	var b strings.Builder
	for _, topic := range slices.Sorted(maps.Keys(want)) {
		c := per[topic]
		if c["total"] == want[topic] && c[schema.Minute.String()] == want[topic] && c[schema.Hour.String()] == want[topic] {
			continue
		}
		fmt.Fprintf(&b, "%s: want %d, totals %v\n", topic, want[topic], c)
		its := all[topic]
		slices.SortFunc(its, func(a, b item) int { return strings.Compare(a.pk, b.pk) })
		for _, it := range its {
			fmt.Fprintf(&b, "  %s %s\n", it.pk, strings.Join(it.rest, " "))
		}
	}
	return b.String()
}
