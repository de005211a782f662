package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/internal/ddbfault"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/loadgen"
	"github.com/hotcount/hotcount/quarantine"
	"github.com/hotcount/hotcount/store"
	"github.com/hotcount/hotcount/streams"
)

// TestQuarantinePoisonTopic is issue 27's scenario in JetStream mode, with
// a short bound: the store refuses every write of one topic for good (403
// AccessDeniedException from the fault proxy) while 50 other topics keep
// coming. The others are written throughout; after --quarantine-after the
// poison topic's writes move to the quarantine, its messages are
// acknowledged and its journal entries retired; `hotcount quarantine
// list` shows them; once the store takes the topic again its later
// mentions are written normally, `hotcount quarantine replay` writes the
// held ones, and every topic's total and buckets are exactly what was
// published; a second replay writes nothing.
func TestQuarantinePoisonTopic(t *testing.T) {
	p := poisonedSetup(t, "journal")
	url, nc, js, d, table, proxy, settings := p.url, p.nc, p.js, p.d, p.table, p.proxy, p.settings
	c := startChild(t, append(settings, "--flush-interval", "100ms", "--quarantine-after", "3s", "--windows", "1m,1h", "--log-level", "warn")...)

	ctx := context.Background()
	poison := int64(0)
	publishPoison := func(n int) {
		for i := range n {
			if _, err := js.Publish(ctx, "mentions.poison", fmt.Appendf(nil, `{"count":%d}`, 1+i%3)); err != nil {
				t.Fatal(err)
			}
			poison += int64(1 + i%3)
		}
	}
	others := map[string]int64{}
	publishOthers := func(seed uint64, messages int64) error {
		rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 50, Messages: messages, Count: 1, Seed: seed, JetStream: true})
		for topic, n := range rep.PerTopic {
			others[topic] += n
		}
		return err
	}
	tableHolds := func(want map[string]int64) func() error {
		return func() error {
			got, _ := d.Counts(t, table)
			for topic, n := range want {
				if got[topic] != n {
					return fmt.Errorf("topic %s: table %d, want %d", topic, got[topic], n)
				}
			}
			return nil
		}
	}

	// 1. Refused for good: the others are written while poison waits.
	publishPoison(300)
	if err := publishOthers(1, 5_000); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, tableHolds(others))
	if got, _ := d.Counts(t, table); got["poison"] != 0 {
		t.Fatalf("poison = %d in the table while its writes are refused", got["poison"])
	}
	// 2. Quarantined after the bound, every mention of it, while the
	// others keep coming (the store taking them is what tells a poison
	// topic from an outage), and its messages acknowledged: the
	// consumer is idle, nothing held.
	// Whole rounds only, each acknowledged, so that the tally is exact.
	stopOthers := make(chan struct{})
	published := make(chan error, 1)
	go func() { // owned here: stopped and waited for below
		for seed := uint64(10); ; seed++ {
			select {
			case <-stopOthers:
				published <- nil
				return
			default:
			}
			if err := publishOthers(seed, 200); err != nil {
				published <- err
				return
			}
		}
	}()
	testenv.Eventually(t, time.Minute, func() error {
		if n := c.metric(t, "hotcount_flusher_quarantined_mentions_total"); n != float64(poison) {
			return fmt.Errorf("quarantined %v mentions of poison's %d", n, poison)
		}
		return nil
	})
	close(stopOthers)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	testenv.ConsumerIdle(t, url, "MENTIONS", "hotcount", 30*time.Second)
	var out bytes.Buffer
	if err := dispatch(ctx, append([]string{"quarantine", "list", "--json"}, settings...), nil, &out, &out); err != nil {
		t.Fatalf("quarantine list: %v\n%s", err, out.String())
	}
	var held []quarantine.Entry
	if err := json.Unmarshal(out.Bytes(), &held); err != nil {
		t.Fatalf("quarantine list --json: %v\n%s", err, out.String())
	}
	var heldMentions int64
	for _, e := range held {
		c, _ := store.ParseName(e.Counter)
		if e.Topic != "poison" || !strings.Contains(e.Reason, "AccessDeniedException") {
			t.Errorf("held %+v: want poison's, refused with AccessDeniedException", e)
		}
		if c.CountsMentions() {
			heldMentions += e.Delta
		}
	}
	if heldMentions != poison {
		t.Fatalf("quarantine list shows %d of poison's mentions, want %d:\n%s", heldMentions, poison, out.String())
	}
	out.Reset()
	if err := dispatch(ctx, append([]string{"quarantine", "list"}, settings...), nil, &out, &out); err != nil || !strings.Contains(out.String(), fmt.Sprintf("%d mentions in topic totals", poison)) {
		t.Fatalf("quarantine list = %v:\n%s", err, out.String())
	}
	// The journal holds nothing for it: its entries retired.
	testenv.Eventually(t, time.Minute, func() error {
		if open, err := openJournalEntries(nc, journal.DefaultBucket); err != nil || open != 0 {
			return fmt.Errorf("%d journal entries open (%v)", open, err)
		}
		return nil
	})

	// 3. The cause fixed: later mentions are written normally, the
	// replay writes the held ones, once.
	proxy.Allow()
	before := poison
	publishPoison(100)
	if err := publishOthers(2, 5_000); err != nil {
		t.Fatal(err)
	}
	later := map[string]int64{"poison": poison - before}
	for topic, n := range others {
		later[topic] = n
	}
	testenv.Eventually(t, time.Minute, tableHolds(later))
	out.Reset()
	if err := dispatch(ctx, append([]string{"quarantine", "replay"}, settings...), nil, &out, &out); err != nil {
		t.Fatalf("quarantine replay: %v\n%s", err, out.String())
	}
	t.Logf("quarantine replay: %s", out.String())
	if err := tableHolds(map[string]int64{"poison": poison})(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := dispatch(ctx, append([]string{"quarantine", "replay"}, settings...), nil, &out, &out); err != nil || !strings.Contains(out.String(), "written: 0 writes") {
		t.Fatalf("second replay = %v:\n%s", err, out.String())
	}
	testenv.ConsumerIdle(t, url, "MENTIONS", "hotcount", 30*time.Second)
	all := map[string]int64{"poison": poison}
	for topic, n := range others {
		all[topic] = n
	}
	if err := tableHolds(all)(); err != nil {
		t.Fatal(err)
	}
	buckets, _ := d.Buckets(t, table)
	for _, g := range []store.Granularity{store.Minute, store.Hour} {
		per := map[string]int64{}
		for b, n := range buckets {
			if b.G == g {
				per[b.Topic] += n
			}
		}
		for topic, n := range all {
			if per[topic] != n {
				t.Errorf("topic %s: its %s buckets hold %d, published %d", topic, g, per[topic], n)
			}
		}
	}
	if did := proxy.Stats().Did[ddbfault.Denied]; did == 0 {
		t.Error("the proxy denied nothing: the test proves less than it says")
	}

	// 4. The audit recounts the stream against the table: no difference;
	// then one of poison's shards changed by hand, and it says which.
	audit := append([]string{"audit", "--windows", "1m,1h"}, settings...)
	out.Reset()
	if err := dispatch(ctx, audit, nil, &out, &out); err != nil || !strings.Contains(out.String(), "no difference") {
		t.Fatalf("hotcount audit = %v, want no difference:\n%s", err, out.String())
	}
	if _, err := d.Client().UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &table,
		Key:                       map[string]types.AttributeValue{store.AttrPK: &types.AttributeValueMemberS{Value: store.ShardKey("poison", 0)}},
		UpdateExpression:          aws.String("ADD #c :d"),
		ExpressionAttributeNames:  map[string]string{"#c": store.AttrCount},
		ExpressionAttributeValues: map[string]types.AttributeValue{":d": &types.AttributeValueMemberN{Value: "5"}},
	}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err := dispatch(ctx, audit, nil, &out, &out)
	listed := strings.Join(strings.Fields(out.String()), " ")
	if err == nil || !strings.Contains(listed, fmt.Sprintf("poison total - %d %d +5", poison, poison+5)) {
		t.Fatalf("hotcount audit after poison's shard 0 gained 5 = %v, want that difference listed:\n%s", err, out.String())
	}
}

// TestQuarantinePositionEngine is the same poison topic with the position
// engine, the default: refused for --quarantine-after, its mentions are
// held in the stream's checkpoint record (the others written, the
// checkpoint past it), `hotcount quarantine list` shows them, and once the
// store takes the topic the sidecar writes them itself, once: the table
// ends with every mention the stream stores, buckets included.
func TestQuarantinePositionEngine(t *testing.T) {
	p := poisonedSetup(t, "position")
	url, nc, js, d, table, proxy, settings := p.url, p.nc, p.js, p.d, p.table, p.proxy, p.settings
	c := startChild(t, append(settings, "--flush-interval", "100ms", "--quarantine-after", "2s", "--windows", "1m,1h", "--log-level", "warn")...)
	ctx := context.Background()
	want := map[string]int64{}
	publish := func(seed uint64) {
		rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 20, Messages: 2_000, Count: 1, Seed: seed, JetStream: true})
		if err != nil {
			t.Fatal(err)
		}
		for topic, n := range rep.PerTopic {
			want[topic] += n
		}
		for range 100 {
			if _, err := js.Publish(ctx, "mentions.poison", []byte(`{"count":1}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(1)
	testenv.Eventually(t, time.Minute, func() error {
		if n := c.metric(t, "hotcount_flusher_quarantined_mentions_total"); n < 100 {
			return fmt.Errorf("held %v of poison's 100 mentions", n)
		}
		return nil
	})
	testenv.Checkpointed(t, url, []string{"MENTIONS"}, time.Minute) // past the held topic
	var out bytes.Buffer
	if err := dispatch(ctx, append([]string{"quarantine", "list"}, settings...), nil, &out, &out); err != nil || !strings.Contains(out.String(), "AccessDeniedException") {
		t.Fatalf("quarantine list = %v:\n%s", err, out.String())
	}
	t.Logf("quarantine list:\n%s", out.String())
	got, _ := d.Counts(t, table)
	if got["poison"] != 0 {
		t.Fatalf("poison = %d in the table while its writes are refused", got["poison"])
	}

	proxy.Allow()
	publish(2)
	stored := storedMentions(t, js, streams.Layout{Stream: "MENTIONS", Subject: "mentions.>"})
	testenv.Eventually(t, time.Minute, tableHolds(t, d, table, stored))
	buckets, _ := d.Buckets(t, table)
	var minutes int64
	for b, n := range buckets {
		if b.G == store.Minute && b.Topic == "poison" {
			minutes += n
		}
	}
	if minutes != stored["poison"] {
		t.Errorf("poison's minute buckets hold %d, want %d", minutes, stored["poison"])
	}
}

// poisoned is a jetstream-mode setup, the stream created, whose store
// refuses every write of the topic poison for good (an IAM condition:
// 403 AccessDeniedException) through a fault proxy; settings are the
// sidecar's and the commands' settings for engine.
type poisoned struct {
	url      string
	nc       *nats.Conn
	js       jetstream.JetStream
	d        *testenv.Dynalite
	table    string
	proxy    *ddbfault.Proxy
	settings []string
}

func poisonedSetup(t *testing.T, engine string) poisoned {
	t.Helper()
	ns := testenv.NATS(t)
	p := poisoned{url: ns.ClientURL(), nc: testenv.Connect(t, ns.ClientURL())}
	if _, err := ingest.EnsureStream(context.Background(), p.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	var err error
	if p.js, err = jetstream.New(p.nc); err != nil {
		t.Fatal(err)
	}
	p.d = testenv.StartDynalite(t)
	p.table = p.d.Table(t, "quarantine")
	testenv.AWSEnv(t)
	p.proxy = ddbfault.New(ddbfault.Config{Upstream: p.d.Endpoint})
	endpoint, stop, err := p.proxy.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	p.proxy.Deny(ddbfault.Denial{Keys: ddbfault.TopicKeys("poison"), Status: 403, Type: "AccessDeniedException"})
	p.settings = []string{"--nats-mode", "jetstream", "--durable-engine", engine, "--nats-url", p.url, "--dynamodb-endpoint", endpoint, "--table", p.table}
	return p
}
