package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// The stream carries its rules: a fleet of two settings counts alike.

// TestMixedFleetCountsByTheStreamsRules is a rolling deploy that changes
// settings that decide counts, in partitioned mode, with the binary: one
// sidecar at --max-count 1000 --windows 1m (the first, whose settings
// become the streams' rules), one at --max-count 100 --windows 1m,1h.
// Mentions of count 500 and of count 50 arrive together; one sidecar is
// frozen so that the other takes its partitions over and reads what it
// had read; mid-load, `hotcount stream rules set --max-count 100
// --windows 1m,1h` changes the rules under load. The table must hold
// exactly what the rules in force at each message's sequence give, which
// the test computes by reading the streams itself: before the change
// every mention counts, in its total and its minute; after it, a mention
// of 500 is rejected, and the others count in their hour too.
func TestMixedFleetCountsByTheStreamsRules(t *testing.T) {
	l := streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: 4}
	ns := testenv.NATSMapped(t, testenv.Partitioned(l))
	url := ns.ClientURL()
	nc := testenv.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := streams.Ensure(context.Background(), js, l, streams.Options{MaxAge: time.Hour, MaxBytes: 1 << 30, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "mixed")
	testenv.AWSEnv(t)
	common := []string{"--nats-mode", "partitioned", "--partitions", "4", "--nats-url", url, "--flush-interval", "300ms",
		"--log-level", "warn", "--dynamodb-endpoint", d.Endpoint, "--table", table}
	first := startChild(t, append(common, "--max-count", "1000", "--windows", "1m")...)
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, name := range l.Names() {
			if h, err := readRules(js, name); err != nil || len(h) == 0 {
				return fmt.Errorf("no rules recorded for %s yet (%v)", name, err)
			}
		}
		return nil
	})
	second := startChild(t, append(common, "--max-count", "100", "--windows", "1m,1h")...)
	if n := second.metric(t, `hotcount_rules_differing_settings{kind="followed"}`); n != 2 {
		t.Fatalf("the second sidecar follows %v of its settings' differences, want 2 (--max-count, --windows)", n)
	}
	kids := []*child{first, second}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan error, 2)
	for i, count := range []int64{500, 50} {
		go func() {
			_, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 20, Rate: 500, Messages: 8_000, Count: count, Seed: uint64(11 + i), JetStream: true})
			sent <- err
		}()
	}
	// Freeze a sidecar that reads and has written; the other takes its
	// partitions over and reads again what it held.
	var frozen, other *child
	testenv.Eventually(t, 60*time.Second, func() error {
		for i, c := range kids {
			if c.metric(t, "hotcount_ingest_partitions_owned") > 0 && c.metric(t, "hotcount_flusher_flushed_mentions_total") > 0 {
				frozen, other = c, kids[1-i]
				return nil
			}
		}
		return errors.New("no sidecar has read and written yet")
	})
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := other.metric(t, "hotcount_ingest_partitions_owned"); n != 4 {
			return fmt.Errorf("the other reads %v of 4 partitions", n)
		}
		return nil
	})
	// The change, under load, while one sidecar is frozen: it meets the
	// change in each stream when it wakes, or its successor does.
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"stream", "rules", "set", "--nats-mode", "partitioned", "--partitions", "4", "--nats-url", url,
		"--max-count", "100", "--windows", "1m,1h", "--why", "a rolling change under load"}, nil, &out, &out); err != nil {
		t.Fatalf("stream rules set: %v\n%s", err, out.String())
	}
	if got := strings.Count(out.String(), "in force from sequence"); got != 4 {
		t.Fatalf("stream rules set changed %d streams, want 4:\n%s", got, out.String())
	}
	since := other.metric(t, "hotcount_flusher_flushed_mentions_total")
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := other.metric(t, "hotcount_flusher_flushed_mentions_total") - since; n < 1_000 {
			return fmt.Errorf("the other wrote %v mentions since the change, want 1,000", n)
		}
		return nil
	})
	if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	}

	want := countByTheRules(t, js, l.Names(), 16_000)
	exact := tableHolds(t, d, table, want.totals)
	testenv.Eventually(t, 90*time.Second, exact)
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
	sums := bucketSums(t, d, table)
	for g, per := range map[schema.Granularity]map[string]int64{schema.Minute: want.minutes, schema.Hour: want.hours} {
		for topic, n := range per {
			if sums[g][topic] != n {
				t.Errorf("topic %s: its %s buckets hold %d, the rules give %d", topic, g, sums[g][topic], n)
			}
		}
		for topic, n := range sums[g] {
			if per[topic] == 0 && n != 0 {
				t.Errorf("topic %s: its %s buckets hold %d, the rules give none", topic, g, n)
			}
		}
	}
	buckets, _ := d.Buckets(t, table)
	if !maps.Equal(buckets, want.buckets) {
		for b, n := range want.buckets {
			if buckets[b] != n {
				t.Errorf("bucket %+v holds %d, the rules give %d", b, buckets[b], n)
			}
		}
		for b, n := range buckets {
			if _, ok := want.buckets[b]; !ok {
				t.Errorf("bucket %+v holds %d, the rules give none", b, n)
			}
		}
	}
	// The test proves something only if the rules made a difference: some
	// mentions rejected after the change, and hours only after it.
	if want.rejected == 0 || want.hourSum == 0 || want.hourSum >= want.minuteSum {
		t.Fatalf("the change decided nothing: %d rejected, %d in hours, %d in minutes", want.rejected, want.hourSum, want.minuteSum)
	}
	t.Logf("exact by the streams' rules: %d mentions in totals and minutes, %d in hours, %d messages of 500 rejected after the change", want.minuteSum, want.hourSum, want.rejected)
}

// byTheRules is what a table must hold: counts the test made itself.
type byTheRules struct {
	totals, minutes, hours map[string]int64
	buckets                map[testenv.Bucket]int64
	minuteSum, hourSum     int64
	rejected               int
}

// countByTheRules reads every stream of names in order, as a user would
// check by hand: a mention ({"count": n}) counts if n is at most the
// --max-count in force, in its total and its minute, and in its hour when
// the windows in force have 1h. Before a stream's change the rules are
// its first (--max-count 1000, --windows 1m), after it --max-count 100,
// --windows 1m,1h. It fails the test unless messages mentions were read.
func countByTheRules(t *testing.T, js jetstream.JetStream, names []string, messages int) byTheRules {
	t.Helper()
	out := byTheRules{totals: map[string]int64{}, minutes: map[string]int64{}, hours: map[string]int64{}, buckets: map[testenv.Bucket]int64{}}
	read := 0
	for _, name := range names {
		cons, err := js.OrderedConsumer(context.Background(), name, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		left := st.CachedInfo().State.Msgs
		changed := false
		for ; left > 0; left-- {
			msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
			if err != nil {
				t.Fatalf("read %s: %v", name, err)
			}
			if msg.Subject() == rules.Subject(name) {
				changed = true
				continue
			}
			md, err := msg.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			var p struct {
				Count int64 `json:"count"`
			}
			if err := json.Unmarshal(msg.Data(), &p); err != nil {
				t.Fatalf("%s: %q: %v", msg.Subject(), msg.Data(), err)
			}
			read++
			maxCount := int64(1000)
			if changed {
				maxCount = 100
			}
			if p.Count > maxCount {
				out.rejected++
				continue
			}
			topic := strings.TrimPrefix(streams.Unstored(msg.Subject()), "mentions.")
			out.totals[topic] += p.Count
			out.minutes[topic] += p.Count
			out.minuteSum += p.Count
			out.buckets[testenv.Bucket{Topic: topic, G: schema.Minute, Index: schema.Minute.Index(md.Timestamp)}] += p.Count
			if changed {
				out.hours[topic] += p.Count
				out.hourSum += p.Count
				out.buckets[testenv.Bucket{Topic: topic, G: schema.Hour, Index: schema.Hour.Index(md.Timestamp)}] += p.Count
			}
		}
		if !changed {
			t.Fatalf("stream %s holds no change of its rules", name)
		}
	}
	if read != messages {
		t.Fatalf("the streams hold %d mentions, %d were published", read, messages)
	}
	return out
}

// readRules is a stream's rules history, as `hotcount stream rules show
// --json` prints it.
func readRules(js jetstream.JetStream, name string) (rules.History, error) {
	kv, err := js.KeyValue(context.Background(), "hotcount_checkpoints")
	if err != nil {
		return nil, err
	}
	return rules.NewBook(js, kv).History(context.Background(), name)
}

// TestTheOddSidecarRefuses is the other mixed fleets, with the binary,
// jetstream mode: a sidecar whose settings would write other items (a
// table made global, one pod restarted in the Region layout) refuses to
// start, naming the setting and the command that changes the stream's
// rules; a core-mode sidecar beside a jetstream fleet (a switch of mode,
// one pod left on the old settings) stops when the fleet's rules appear
// and refuses to start after; and the fleet then counts every mention
// once.
func TestTheOddSidecarRefuses(t *testing.T) {
	ns := testenv.NATS(t)
	url := ns.ClientURL()
	nc := testenv.Connect(t, url)
	if _, err := ingest.EnsureStream(context.Background(), nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "odd")
	testenv.AWSEnv(t)
	common := []string{"--nats-url", url, "--dynamodb-endpoint", d.Endpoint, "--table", table, "--flush-interval", "300ms", "--log-level", "warn", "--data-dir", t.TempDir()}

	// A core-mode sidecar first: the fleet before the switch.
	core := startChild(t, append([]string{"--nats-mode", "core"}, common...)...)
	exited := make(chan error, 1)
	go func() { exited <- core.cmd.Wait() }()
	fleet := startChild(t, append([]string{"--nats-mode", "jetstream"}, common...)...)
	select {
	case err := <-exited:
		if err == nil || !strings.Contains(core.logs.String(), "stream MENTIONS takes mentions.>") {
			t.Fatalf("the core-mode sidecar ended with %v, want an error naming the stream; its log:\n%s", err, core.logs)
		}
	case <-time.After(60 * time.Second): // a deadline against a hang; it ends within 10 s
		t.Fatalf("the core-mode sidecar still runs beside the jetstream fleet; its log:\n%s", core.logs)
	}

	for _, odd := range []struct {
		name string
		args []string
		says []string
	}{
		{"Region layout", []string{"--nats-mode", "jetstream", "--region", "us-east-1", "--regions", "us-east-1"},
			[]string{`--region: the stream's rules say "", this sidecar's settings "us-east-1"`, "hotcount stream rules set --region us-east-1"}},
		{"another table", []string{"--nats-mode", "jetstream", "--table", table + "-restored"},
			[]string{"--table", "hotcount stream rules set --table " + table + "-restored"}},
		{"core mode", []string{"--nats-mode", "core"},
			[]string{"stream MENTIONS takes mentions.>", "--nats-mode jetstream"}},
	} {
		t.Run(odd.name, func(t *testing.T) {
			args := append(append([]string{}, common...), odd.args...) // a later --table wins
			logs, err := runToExit(t, args...)
			if err == nil {
				t.Fatalf("started and ended cleanly; its log:\n%s", logs)
			}
			for _, s := range odd.says {
				if !strings.Contains(logs, s) {
					t.Errorf("its log does not say %q:\n%s", s, logs)
				}
			}
		})
	}

	rep, err := loadgen.Run(context.Background(), nc, loadgen.Config{Prefix: "mentions.", Topics: 10, Messages: 2_000, Count: 1, Seed: 5, JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, tableHolds(t, d, table, rep.PerTopic))
	if err := fleet.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := fleet.cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, fleet.logs)
	}
	if err := tableHolds(t, d, table, rep.PerTopic)(); err != nil {
		t.Fatal(err)
	}
}

// runToExit runs `hotcount run` with args and free ports until it exits,
// and returns how it ended and what it logged.
func runToExit(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"run", "--admin", freeAddr(t), "--http", freeAddr(t)}, args...)...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return logs.String(), err
	case <-time.After(90 * time.Second): // a deadline against a hang
		cmd.Process.Kill() //nolint:errcheck // it may have exited
		<-done
		t.Fatalf("still running after 90 s; its log:\n%s", logs.String())
		return "", nil
	}
}

// TestRewindFillsARestoredTable is the runbook's point-in-time restore,
// with the binary, jetstream mode, mentions arriving throughout: a backup
// of the table taken while the sidecar writes (each item copied as it is
// then, into a new table), then `hotcount stream rules set --table` (the
// old sidecar meets it and stops), `hotcount stream rewind --to` the time
// the runbook gives (the scrape's time less the oldest unwritten
// mention's age) for the new table, and a sidecar on the new table: every
// total and bucket exact, and the audit clean. Then the same from an
// empty table with --to-start.
func TestRewindFillsARestoredTable(t *testing.T) {
	url, nc, d := jetstreamAndDynalite(t)
	live := d.Table(t, "live")
	common := []string{"--nats-mode", "jetstream", "--nats-url", url, "--dynamodb-endpoint", d.Endpoint, "--flush-interval", "300ms",
		"--log-level", "warn", "--windows", "1m,1h"}
	old := startChild(t, append(common, "--table", live)...)
	oldExited := make(chan error, 1)
	go func() { oldExited <- old.cmd.Wait() }()

	sent := loadUnder(t, nc, old, 21)
	// The backup, and the time to rewind to: every mention unwritten at
	// the scrape was published at most the gauge's age before it, so
	// everything older was in the items then, and in the backup after.
	scraped := time.Now()
	unwritten := old.metric(t, "hotcount_durable_oldest_unwritten_seconds")
	backup := time.Now()
	restored := d.Table(t, "restored")
	copied := copyTable(t, d, live, restored)
	rewindTo := scraped.Add(-time.Duration(unwritten * float64(time.Second)))
	t.Logf("backup at %s: %d items copied; oldest unwritten %.3f s; rewinding to %s", backup.Format(time.RFC3339Nano), copied, unwritten, rewindTo.Format(time.RFC3339Nano))

	var out bytes.Buffer
	run := func(args ...string) {
		t.Helper()
		out.Reset()
		if err := dispatch(context.Background(), append(args, "--nats-mode", "jetstream", "--nats-url", url), nil, &out, &out); err != nil {
			t.Fatalf("hotcount %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
	run("stream", "rules", "set", "--table", restored, "--why", "restored from the backup")
	run("stream", "rewind", "--to", rewindTo.Format(time.RFC3339Nano), "--table", restored, "--dry-run")
	if !strings.Contains(out.String(), "would rewind") {
		t.Fatalf("--dry-run said:\n%s", out.String())
	}
	run("stream", "rewind", "--to", rewindTo.Format(time.RFC3339Nano), "--table", restored)
	t.Logf("%s", out.String())
	select {
	case err := <-oldExited:
		if err == nil || !strings.Contains(old.logs.String(), "--table") {
			t.Fatalf("the sidecar on the old table ended with %v, want an error naming --table; its log:\n%s", err, old.logs)
		}
	case <-time.After(60 * time.Second): // a deadline against a hang
		t.Fatalf("the sidecar on the old table still runs after the table changed; its log:\n%s", old.logs)
	}
	fresh := startChild(t, append(common, "--table", restored)...)
	r := <-sent
	if r.err != nil {
		t.Fatal(r.err)
	}
	testenv.Eventually(t, 90*time.Second, tableHolds(t, d, restored, r.rep.PerTopic))
	exactBuckets(t, d, restored, r.rep.PerTopic)
	run("audit", "--windows", "1m,1h", "--dynamodb-endpoint", d.Endpoint, "--table", restored)
	if !strings.Contains(out.String(), "no difference") {
		t.Fatalf("the audit of the restored table:\n%s", out.String())
	}

	// A table lost and created empty: everything the stream holds.
	empty := d.Table(t, "empty")
	run("stream", "rules", "set", "--table", empty, "--why", "the table was lost")
	run("stream", "rewind", "--to-start", "--table", empty)
	startChild(t, append(common, "--table", empty)...)
	testenv.Eventually(t, 90*time.Second, tableHolds(t, d, empty, r.rep.PerTopic))
	exactBuckets(t, d, empty, r.rep.PerTopic)
	_ = fresh // stopped by the change to the empty table
}

// jetstreamAndDynalite is a NATS server with jetstream mode's stream and
// a dynalite, for the binary (the AWS environment set).
func jetstreamAndDynalite(t *testing.T) (url string, nc *nats.Conn, d *testenv.Dynalite) {
	t.Helper()
	url = testenv.NATS(t).ClientURL()
	nc = testenv.Connect(t, url)
	if _, err := ingest.EnsureStream(context.Background(), nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	d = testenv.StartDynalite(t)
	testenv.AWSEnv(t)
	return url, nc, d
}

// loaded is what a load published, or why it failed.
type loaded struct {
	rep loadgen.Report
	err error
}

// loadUnder publishes 9,000 mentions over 30 topics at 600 a second from
// seed in the background, and returns once c has written 2,000 of them;
// the load's report arrives on the channel when it ends.
func loadUnder(t *testing.T, nc *nats.Conn, c *child, seed uint64) <-chan loaded {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sent := make(chan loaded, 1)
	go func() {
		rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 30, Rate: 600, Messages: 9_000, Count: 1, Seed: seed, JetStream: true})
		sent <- loaded{rep, err}
	}()
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := c.metric(t, "hotcount_flusher_flushed_mentions_total"); n < 2_000 {
			return fmt.Errorf("%v mentions written", n)
		}
		return nil
	})
	return sent
}

// copyTable copies every item of from into to, each as it is when read:
// a backup taken while the table is written.
func copyTable(t *testing.T, d *testenv.Dynalite, from, to string) int {
	t.Helper()
	n := 0
	p := dynamodb.NewScanPaginator(d.Client(), &dynamodb.ScanInput{TableName: &from})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range page.Items {
			if _, err := d.Client().PutItem(context.Background(), &dynamodb.PutItemInput{TableName: &to, Item: it}); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	return n
}

// TestRewindWithTheFleetRunning is a table lost and created again under a
// running sidecar: the table deleted mid-load (every write fails, the
// window holds what was read), `hotcount stream rewind --to-start` while
// the sidecar runs, then the table created empty. The sidecar must not
// write what it read before the rewind (its spans assume the old
// checkpoint, so the items would start in the middle of their mentions)
// and must read everything again: the new table ends with every mention
// once.
func TestRewindWithTheFleetRunning(t *testing.T) {
	url, nc, d := jetstreamAndDynalite(t)
	table := d.Table(t, "lost")
	c := startChild(t, "--nats-mode", "jetstream", "--nats-url", url, "--dynamodb-endpoint", d.Endpoint, "--flush-interval", "300ms",
		"--log-level", "warn", "--table", table)
	sent := loadUnder(t, nc, c, 23)
	if _, err := d.Client().DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: &table}); err != nil {
		t.Fatal(err)
	}
	failed := c.metric(t, `hotcount_durable_writes_total{outcome="failed"}`)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := c.metric(t, `hotcount_durable_writes_total{outcome="failed"}`); n <= failed {
			return errors.New("no write has failed since the table went")
		}
		return nil
	})
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"stream", "rewind", "--nats-mode", "jetstream", "--nats-url", url, "--to-start", "--table", table}, nil, &out, &out); err != nil {
		t.Fatalf("stream rewind: %v\n%s", err, out.String())
	}
	d.Table(t, table)
	r := <-sent
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := testenv.Poll(90*time.Second, tableHolds(t, d, table, r.rep.PerTopic)); err != nil {
		logs := c.logs.String()
		t.Fatalf("%v\n%s\n%s", err, out.String(), logs[max(0, len(logs)-30000):])
	}
}
