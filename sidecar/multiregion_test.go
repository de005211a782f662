package sidecar_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/globaltable"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// The two Regions of the multi-Region tests, and the replication delay of
// their global table (DynamoDB's is typically under a second or two).
var twoRegions = []string{"us-east-1", "eu-west-1"}

const replicationDelay = 300 * time.Millisecond

// region is one Region of a global table as a team runs it: its own NATS
// server and stream, and two sidecars in JetStream mode sharing its
// consumer, all talking to the Region's replica.
type region struct {
	name     string
	nats     string
	sidecars []*sidecartest.Sidecar
}

// startRegions starts every Region of em, writing Region-owned shards when
// owned (--region; the other Regions are found in the table's replicas),
// else the single-Region layout (each Region's sidecars writing the same
// items).
func startRegions(t *testing.T, em *globaltable.Emulator, table string, owned bool, tune ...func(*config.Config)) []*region {
	testenv.AWSEnv(t)
	var out []*region
	for _, name := range em.Regions() {
		ns := testenv.NATS(t)
		cfg := config.Default()
		cfg.NATSURL = ns.ClientURL()
		cfg.NATSMode = config.ModeJetStream
		cfg.DynamoDBEndpoint = em.Endpoint(name)
		cfg.Table = table
		cfg.Windows = config.DevWindows
		cfg.FlushInterval = 100 * time.Millisecond
		cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
		if owned {
			// The Region only: the others are the table's replicas.
			cfg.Region = name
		}
		for _, f := range tune {
			f(&cfg)
		}
		if _, err := ingest.EnsureStream(context.Background(), testenv.Connect(t, cfg.NATSURL), cfg.Stream, cfg.Subject, time.Minute); err != nil {
			t.Fatal(err)
		}
		r := &region{name: name, nats: cfg.NATSURL}
		for range 2 {
			c := cfg
			c.DataDir = t.TempDir()
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			r.sidecars = append(r.sidecars, sidecartest.Run(t, c, zaptest.NewLogger(t).Named(name)))
		}
		out = append(out, r)
	}
	return out
}

// publishEverywhere publishes, in every Region at once, mentions of the
// same hot topics (topic-0.. , Zipf-skewed), different in each Region, and
// returns what each Region's stream stored, by topic.
func publishEverywhere(t *testing.T, regions []*region, messages int64, seed uint64) []map[string]int64 {
	per := make([]map[string]int64, len(regions))
	errs := make([]error, len(regions))
	var wg sync.WaitGroup
	for i, r := range regions {
		nc := testenv.Connect(t, r.nats)
		wg.Go(func() {
			rep, err := loadgen.Run(context.Background(), nc, loadgen.Config{Prefix: "mentions.", Topics: 20, Zipf: 1.2, Messages: messages, Rate: 4_000, Count: 1 + int64(i), Seed: seed + uint64(i), JetStream: true})
			if err == nil && rep.Unacknowledged > 0 {
				// Given up, each may or may not be stored: the counts
				// the test wants are not known (a run beside a package
				// install gave up 1,771 that were stored).
				err = fmt.Errorf("%d publishes not acknowledged in time: the exact counts are unknown", rep.Unacknowledged)
			}
			per[i], errs[i] = rep.PerTopic, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: publish: %v", regions[i].name, err)
		}
	}
	return per
}

// plus adds up counts by topic.
func plus(counts ...map[string]int64) map[string]int64 {
	out := make(map[string]int64)
	for _, m := range counts {
		for topic, n := range m {
			out[topic] += n
		}
	}
	return out
}

// regionCounts is what Region name's replica holds, by topic: the sum of
// every shard item (every Region's, and the single-Region layout's).
func regionCounts(t *testing.T, em *globaltable.Emulator, name, table string) map[string]int64 {
	got, _ := (&testenv.Dynalite{Endpoint: em.Endpoint(name)}).Counts(t, table)
	return got
}

// allIdle waits until every Region's sidecars have checkpointed the
// whole of its stream: everything published is written.
func allIdle(t *testing.T, regions []*region) {
	for _, r := range regions {
		testenv.Checkpointed(t, r.nats, []string{"MENTIONS"}, time.Minute)
	}
}

// TestGlobalTableSingleRegionLayoutLosesCounts shows the loss issue 28 is
// about, as a test that expects it: two Regions' sidecars writing the
// single-Region layout (every Region the same shard items) of one global
// table. Replication settles their concurrent ADDs by last writer wins, and
// once it has, each Region's total is short of what both published.
func TestGlobalTableSingleRegionLayoutLosesCounts(t *testing.T) {
	em := globaltable.Start(t, twoRegions, replicationDelay)
	em.ListReplicas(false) // or the sidecars would find the table global
	em.CreateTable(t, "hotcount")
	regions := startRegions(t, em, "hotcount", false)
	per := publishEverywhere(t, regions, 8_000, 281)
	want := plus(per...)
	allIdle(t, regions)
	// Each Region's sidecars wrote every mention of their Region before
	// they stop: stopped sooner, what a Region left unread stays in its
	// stream, lost for a reason other than the one shown (one Region
	// wrote nothing in a loaded run from an empty build cache).
	for i, r := range regions {
		testenv.Eventually(t, time.Minute, func() error {
			var flushed float64
			for _, s := range r.sidecars {
				flushed += testenv.Metric(t, s.Registry(), "hotcount_flusher_flushed_mentions_total")
			}
			if flushed < float64(sum(per[i])) {
				return fmt.Errorf("%s: %v of %d mentions written", r.name, flushed, sum(per[i]))
			}
			return nil
		})
	}
	for _, r := range regions {
		for _, s := range r.sidecars {
			if err := s.Stop(); err != nil {
				t.Fatalf("%s: shutdown: %v", r.name, err)
			}
		}
	}
	em.Settled(t, time.Minute)
	for _, name := range twoRegions {
		got := regionCounts(t, em, name, "hotcount")
		lost := sum(want) - sum(got)
		t.Logf("%s: the table holds %d of the %d mentions both Regions published: %d lost (%.1f%%) to last-writer-wins; %d replicated images discarded",
			name, sum(got), sum(want), lost, 100*float64(lost)/float64(sum(want)), em.Conflicts())
		if lost <= 0 {
			t.Errorf("%s: nothing lost (%d of %d): the emulator no longer shows the conflict", name, sum(got), sum(want))
		}
	}
	if shared := em.Shared(); len(shared) == 0 {
		t.Error("no item written in both Regions: the layout under test is not the single-Region one")
	}
}

// TestGlobalTableRegionShardsExact: the same two Regions with Region-owned
// shards. Every topic's total in each Region equals every mention both
// Regions published, exactly, and so do its windowed count and its count in
// /v1/trending; then one Region is cut off from the other for 30 s while
// both keep counting, and once reconnected nothing is lost and nothing
// counted twice.
func TestGlobalTableRegionShardsExact(t *testing.T) {
	em := globaltable.Start(t, twoRegions, replicationDelay)
	em.CreateTable(t, "hotcount")
	// The fleet's history an hour back: trending ranks at once, each
	// topic on a baseline of 0, instead of after the window's length.
	if _, err := em.Client(twoRegions[0]).PutItem(context.Background(), &dynamodb.PutItemInput{
		TableName: aws.String("hotcount"),
		Item: map[string]types.AttributeValue{
			schema.AttrPK:    &types.AttributeValueMemberS{Value: schema.InRegion(schema.HistoryKey, twoRegions[0])},
			schema.AttrSince: &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)},
		},
	}); err != nil {
		t.Fatal(err)
	}
	regions := startRegions(t, em, "hotcount", true)

	want := plus(publishEverywhere(t, regions, 8_000, 283)...)
	exactEverywhere(t, em, regions, want, "both Regions publishing")
	for _, r := range regions {
		checkReads(t, r, want)
	}

	cut := twoRegions[1]
	em.Cut(cut)
	healAt := time.Now().Add(30 * time.Second)
	more := publishEverywhere(t, regions, 40_000, 285) // 10 s at 4,000/s in each
	// Cut off, each Region counts its own mentions: its replica holds
	// them, and none of the other Region's since the cut.
	allIdle(t, regions)
	for i, name := range twoRegions {
		own := plus(want, more[i])
		testenv.Eventually(t, 30*time.Second, func() error {
			if got := regionCounts(t, em, name, "hotcount"); sum(got) != sum(own) {
				return fmt.Errorf("%s, cut off: the replica holds %d mentions, want its own %d and what came before", name, sum(got), sum(own))
			}
			return nil
		})
	}
	if wait := time.Until(healAt); wait > 0 {
		time.Sleep(wait) // the cut lasts 30 s, as the issue has it
	}
	em.Heal(cut)
	want = plus(want, more[0], more[1])
	exactEverywhere(t, em, regions, want, "after 30 s cut off")
	for _, r := range regions {
		checkReads(t, r, want)
	}
	if shared := em.Shared(); len(shared) > 0 {
		t.Errorf("items written in both Regions: %v", shared)
	}
	if c := em.Conflicts(); c != 0 {
		t.Errorf("%d replicated images discarded: Region-owned shards should never conflict", c)
	}
}

// exactEverywhere waits until every Region's replica holds exactly want,
// topic by topic, after all Regions' consumers are idle.
func exactEverywhere(t *testing.T, em *globaltable.Emulator, regions []*region, want map[string]int64, when string) {
	t.Helper()
	allIdle(t, regions)
	for _, name := range twoRegions {
		testenv.Eventually(t, time.Minute, func() error {
			got := regionCounts(t, em, name, "hotcount")
			for topic, n := range want {
				if got[topic] != n {
					return fmt.Errorf("%s, %s: topic %s: the replica holds %d, both Regions published %d", when, name, topic, got[topic], n)
				}
			}
			if sum(got) != sum(want) {
				return fmt.Errorf("%s, %s: the replica holds %d mentions, both Regions published %d", when, name, sum(got), sum(want))
			}
			return nil
		})
	}
	// Exact, and it stays so: nothing still in flight adds to it.
	em.Settled(t, time.Minute)
	for _, name := range twoRegions {
		if got := regionCounts(t, em, name, "hotcount"); sum(got) != sum(want) {
			t.Errorf("%s, %s: %d mentions once settled, want %d", when, name, sum(got), sum(want))
		}
	}
}

// checkReads reads, from a sidecar of r, every topic's total (strongly
// consistent), and the hottest topic's count over the last hour and in
// /v1/trending: each is both Regions' mentions. The shards endpoint gives
// each Region's part.
func checkReads(t *testing.T, r *region, want map[string]int64) {
	t.Helper()
	const hot = "topic-0"
	url := r.sidecars[0].URL()
	var total struct {
		Count int64 `json:"count"`
	}
	getURL(t, url+"/v1/topics/"+hot+"?consistency=strong", &total)
	if total.Count != want[hot] {
		t.Errorf("%s: total of %s %d, want %d", r.name, hot, total.Count, want[hot])
	}
	// Every topic, through the lookup's own reads (the replicas' items
	// agreeing says nothing of what a sidecar sums).
	for topic, n := range want {
		getURL(t, url+"/v1/topics/"+topic+"?consistency=strong", &total)
		if total.Count != n {
			t.Errorf("%s: total of %s %d, want %d", r.name, topic, total.Count, n)
		}
	}
	var shards struct {
		Regions []schema.RegionPart `json:"regions"`
	}
	getURL(t, url+"/v1/topics/"+hot+"/shards", &shards)
	var parts int64
	for _, p := range shards.Regions {
		parts += p.Count
		if p.Region != "" && (p.Count == 0 || p.UpdatedAt == 0) {
			t.Errorf("%s: part %+v: every Region published %s", r.name, p, hot)
		}
	}
	if len(shards.Regions) != 3 || parts != want[hot] { // the single-Region layout's part is 0
		t.Errorf("%s: parts %+v of %s, want the single-Region layout's and both Regions' summing to %d", r.name, shards.Regions, hot, want[hot])
	}
	testenv.Eventually(t, 30*time.Second, func() error { // windows are cached like totals
		var w struct {
			Count int64 `json:"count"`
		}
		getURL(t, url+"/v1/topics/"+hot+"?window=1h", &w)
		if w.Count != want[hot] {
			return fmt.Errorf("%s: %s over the last hour %d, want %d", r.name, hot, w.Count, want[hot])
		}
		var tr struct {
			Topics []struct {
				Topic string `json:"topic"`
				Count int64  `json:"count"`
			} `json:"topics"`
		}
		getURL(t, url+"/v1/trending?window=15m&limit=100", &tr)
		for _, c := range tr.Topics {
			if c.Topic == hot {
				if c.Count != want[hot] {
					return fmt.Errorf("%s: trending counts %s %d, want %d", r.name, hot, c.Count, want[hot])
				}
				return nil
			}
		}
		return fmt.Errorf("%s: %s not trending: %+v", r.name, hot, tr.Topics)
	})
}

// TestRegionsResolved: what a sidecar makes of a table's Regions. The
// emulator's table lists both Regions as replicas: with --region the
// sidecar writes its own and reads both; without, at an endpoint (no SDK
// Region to trust), it refuses to start; a table that lists no replicas
// is the single-Region layout.
func TestRegionsResolved(t *testing.T) {
	em := globaltable.Start(t, twoRegions, replicationDelay)
	em.CreateTable(t, "hotcount")
	testenv.AWSEnv(t)
	cfg := config.Default()
	cfg.Table = "hotcount"
	cfg.DynamoDBEndpoint = em.Endpoint(twoRegions[1])
	resolve := func(cfg config.Config) (schema.Regions, error) {
		return sidecar.Regions(context.Background(), cfg, em.Client(twoRegions[1]), zaptest.NewLogger(t))
	}
	if r, err := resolve(cfg); err == nil {
		t.Errorf("no --region on a global table at an endpoint: resolved %+v, want a refusal", r)
	}
	cfg.Region = twoRegions[1]
	r, err := resolve(cfg)
	if err != nil || r.Own != twoRegions[1] || !slices.Equal(r.All, twoRegions) {
		t.Errorf("--region %s: %+v, %v; want its own, reading %v", cfg.Region, r, err, twoRegions)
	}
	em.ListReplicas(false)
	cfg.Region = ""
	if r, err := resolve(cfg); err != nil || r.Active() {
		t.Errorf("a table with no replicas listed: %+v, %v; want the single-Region layout", r, err)
	}
	cfg.Table = "missing"
	cfg.Region, cfg.Regions = "eu-west-1", "us-east-1"
	if r, err := resolve(cfg); err != nil || r.Own != "eu-west-1" || !slices.Equal(r.All, []string{"us-east-1"}) {
		t.Errorf("a table not there yet, with --region and --regions: %+v, %v", r, err)
	}
}
