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

	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// TestQuarantinePositionEngine is issue 27's poison topic in JetStream
// mode: the store refuses every write of one topic for good (403
// AccessDeniedException from the fault proxy) while other topics keep
// coming. Refused for --quarantine-after, its mentions are
// held in the stream's checkpoint record (the others written, the
// checkpoint past it), `hotcount quarantine list` shows them, and once the
// store takes the topic the sidecar writes them itself, once: the table
// ends with every mention the stream stores, buckets included, and
// `hotcount audit` finds no difference, then the one made by hand.
func TestQuarantinePositionEngine(t *testing.T) {
	p := poisonedSetup(t)
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
	// /healthz stays ok and says what the quarantine holds.
	if h := health(t, c); h.Status != "ok" || h.Quarantine == nil || h.Quarantine.HeldCounters["MENTIONS"] < 3 || h.Quarantine.LimitPerStream != 1000 {
		t.Errorf("/healthz while poison is held: %+v; want ok, and MENTIONS's record holding poison's total, minute and hour of 1000", h)
	}

	proxy.Allow()
	publish(2)
	stored := storedMentions(t, js, streams.Layout{Stream: "MENTIONS", Subject: "mentions.>"})
	testenv.Eventually(t, time.Minute, tableHolds(t, d, table, stored))
	buckets, _ := d.Buckets(t, table)
	var minutes int64
	for b, n := range buckets {
		if b.G == schema.Minute && b.Topic == "poison" {
			minutes += n
		}
	}
	if minutes != stored["poison"] {
		t.Errorf("poison's minute buckets hold %d, want %d", minutes, stored["poison"])
	}
	testenv.Eventually(t, time.Minute, func() error {
		if h := health(t, c); h.Quarantine == nil || len(h.Quarantine.HeldCounters) != 0 {
			return fmt.Errorf("/healthz once the store takes poison: %+v, want nothing held", h)
		}
		return nil
	})
	if did := proxy.Stats().Did[ddbfault.Denied]; did == 0 {
		t.Error("the proxy denied nothing: the test proves less than it says")
	}

	// The audit recounts the stream against the table: no difference;
	// then one of poison's shards changed by hand, and it says which.
	audit := append([]string{"audit", "--windows", "1m,1h"}, settings...)
	out.Reset()
	if err := dispatch(ctx, audit, nil, &out, &out); err != nil || !strings.Contains(out.String(), "no difference") {
		t.Fatalf("hotcount audit = %v, want no difference:\n%s", err, out.String())
	}
	if _, err := d.Client().UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: schema.ShardKey("poison", 0)}},
		UpdateExpression:          aws.String("ADD #c :d"),
		ExpressionAttributeNames:  map[string]string{"#c": schema.AttrCount},
		ExpressionAttributeValues: map[string]types.AttributeValue{":d": &types.AttributeValueMemberN{Value: "5"}},
	}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err := dispatch(ctx, audit, nil, &out, &out)
	listed := strings.Join(strings.Fields(out.String()), " ")
	if err == nil || !strings.Contains(listed, fmt.Sprintf("poison total - %d %d +5", stored["poison"], stored["poison"]+5)) {
		t.Fatalf("hotcount audit after poison's shard 0 gained 5 = %v, want that difference listed:\n%s", err, out.String())
	}
}

// poisoned is a jetstream-mode setup, the stream created, whose store
// refuses every write of the topic poison for good (an IAM condition:
// 403 AccessDeniedException) through a fault proxy; settings are the
// sidecar's and the commands' settings.
type poisoned struct {
	url      string
	nc       *nats.Conn
	js       jetstream.JetStream
	d        *testenv.Dynalite
	table    string
	proxy    *ddbfault.Proxy
	settings []string
}

func poisonedSetup(t *testing.T) poisoned {
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
	p.settings = []string{"--nats-mode", "jetstream", "--nats-url", p.url, "--dynamodb-endpoint", endpoint, "--table", p.table}
	return p
}

// healthBody is what the tests read of /healthz's body.
type healthBody struct {
	Status     string `json:"status"`
	Quarantine *struct {
		HeldCounters   map[string]int `json:"heldCounters"`
		LimitPerStream int            `json:"limitPerStream"`
	} `json:"quarantine"`
}

// health reads c's /healthz.
func health(t *testing.T, c *child) healthBody {
	t.Helper()
	body, err := c.get("/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h healthBody
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatalf("/healthz: %v: %s", err, body)
	}
	return h
}
