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
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// TestAuditCommand runs `hotcount audit` against a stream and a table
// that agree (exit 0, "no difference"), then against a table one of whose
// shards was changed by hand (exit 1, the topic listed with both
// numbers), and with --json.
func TestAuditCommand(t *testing.T) {
	testenv.AWSEnv(t)
	s := testenv.NATS(t)
	d := testenv.StartDynalite(t)
	table := d.Table(t, "hotcount")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := testenv.Connect(t, s.ClientURL())
	if _, err := ingest.EnsureStream(ctx, nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// golang 1+1+5, rust 2, and one the sidecars reject.
	for _, m := range []struct{ subject, payload string }{
		{"mentions.golang", ""}, {"mentions.golang", ""}, {"mentions.golang", `{"count":5}`},
		{"mentions.rust", `{"count":2}`}, {"mentions.rust", `{"count":"many"}`},
	} {
		if _, err := js.Publish(ctx, m.subject, []byte(m.payload)); err != nil {
			t.Fatal(err)
		}
	}
	st := store.NewDynamoDB(d.Client(), table, store.NewMetrics(prometheus.NewRegistry()))
	if err := st.SetMeta(ctx, "golang", schema.Meta{}, schema.Meta{Shards: 2, ReadShards: 2}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		topic        string
		shard, delta int64
	}{{"golang", 0, 4}, {"golang", 1, 3}, {"rust", 0, 2}} {
		if err := st.Add(ctx, testenv.W(w.topic, int(w.shard), w.delta), time.Now()); err != nil {
			t.Fatal(err)
		}
	}

	// The sidecars have written all of it: the stream's checkpoint is at
	// its end.
	if err := durable.Advance(ctx, js, "MENTIONS", "", 5); err != nil {
		t.Fatal(err)
	}

	audit := func(extra ...string) (string, string, int) {
		t.Helper()
		args := append([]string{"audit", "--nats-url", s.ClientURL(), "--nats-mode", "jetstream",
			"--table", table, "--dynamodb-endpoint", d.Endpoint}, extra...)
		var stdout, stderr bytes.Buffer
		err := dispatch(ctx, args, nil, &stdout, &stderr)
		code := exitCode(err, &stderr) // prints the error, as main does
		return stdout.String(), stderr.String(), code
	}

	out, errOut, code := audit()
	if code != exitOK || !strings.Contains(out, "no difference") || !strings.Contains(out, "totals: 2 compared, 0 differ (the stream holds every mention it took)") ||
		!strings.Contains(out, "read: 5 messages, 9 mentions of 2 topics; 1 rejected (count 1)") {
		t.Fatalf("matching table: exit %d, want 0 and no difference, 2 totals compared, the messages read:\n%s%s", code, out, errOut)
	}

	// Shard 1 of golang's total loses its 3.
	_, err = d.Client().UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: schema.ShardKey("golang", 1)}},
		UpdateExpression:          aws.String("SET #c = :c"),
		ExpressionAttributeNames:  map[string]string{"#c": schema.AttrCount},
		ExpressionAttributeValues: map[string]types.AttributeValue{":c": &types.AttributeValueMemberN{Value: "0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = audit()
	t.Logf("hotcount audit, a shard changed:\n%s%s", out, errOut)
	if code != exitError || !strings.Contains(errOut, "counters that differ: 1") {
		t.Errorf("changed table: exit %d, want %d, and stderr to say how many differ:\n%s", code, exitError, errOut)
	}
	if !strings.Contains(out, "counters that differ: 1") || !strings.Contains(strings.Join(strings.Fields(out), " "), "golang total - 7 4 -3") {
		t.Errorf("changed table: the difference is not listed with both numbers:\n%s", out)
	}

	out, _, code = audit("--json")
	var doc struct {
		OK          bool  `json:"ok"`
		Differ      int64 `json:"differ"`
		Messages    int64 `json:"messages"`
		Differences []struct {
			Topic, Counter            string
			Stream, Table, Difference int64
		} `json:"differences"`
		Totals struct {
			Checked  bool  `json:"checked"`
			Compared int64 `json:"compared"`
		} `json:"totals"`
		Notes []string `json:"notes"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json printed no JSON document: %v\n%s", err, out)
	}
	if code != exitError || doc.OK || doc.Differ != 1 || doc.Messages != 5 || !doc.Totals.Checked || doc.Totals.Compared != 2 || len(doc.Differences) != 1 ||
		doc.Differences[0].Topic != "golang" || doc.Differences[0].Counter != "total" || doc.Differences[0].Stream != 7 || doc.Differences[0].Table != 4 || doc.Differences[0].Difference != -3 {
		t.Errorf("--json: exit %d, document %+v; want exit 1 and golang's total, 7 in the stream, 4 in the table", code, doc)
	}

	// A range that holds no mention proves nothing: no all-clear.
	out, errOut, code = audit("--since", "2000-01-01T00:00:00Z", "--until", "2000-01-01T01:00:00Z", "--windows", "1m,1h")
	if code != exitError || !strings.Contains(errOut, "nothing was compared") {
		t.Errorf("an audit that compared nothing: exit %d, want %d and a word that nothing was proved:\n%s%s", code, exitError, out, errOut)
	}
}

// TestAuditFlags: --help says how memory is bounded; bad flags are usage
// errors that name the flag.
func TestAuditFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := dispatch(context.Background(), []string{"audit", "--help"}, nil, &stdout, &stderr)
	if exitCode(err, &stderr) != exitOK || !strings.Contains(stderr.String()+stdout.String(), "--max-counters counters at once") {
		t.Errorf("audit --help: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	checkExits(t, []exitCase{
		{"bad since", []string{"audit", "--since", "yesterday"}, nil, exitUsage, `--since "yesterday" is neither an RFC 3339 time`},
		{"until before since", []string{"audit", "--since", "1h", "--until", "2h"}, nil, exitUsage, "is not after --since"},
		{"nothing to compare", []string{"audit", "--until", "1h"}, nil, exitUsage, "nothing to compare"},
		{"max counters", []string{"audit", "--max-counters", "0"}, nil, exitUsage, "--max-counters 0 must be at least 1"},
	})
}

// TestAuditWhileCounting runs `hotcount audit` against a jetstream-mode
// sidecar counting a steady load of five hot topics, as an on-call
// engineer would mid-incident: every counter is compared exactly up to
// the position its item records (the mentions past the checkpoint, and
// those published during the audit, included as far as the item says),
// none is left out as in flight, and none differs.
func TestAuditWhileCounting(t *testing.T) {
	testenv.AWSEnv(t)
	s := testenv.NATS(t)
	d := testenv.StartDynalite(t)
	table := d.Table(t, "hotcount")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc := testenv.Connect(t, s.ClientURL())
	if _, err := ingest.EnsureStream(ctx, nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	settings := []string{"--nats-mode", "jetstream", "--nats-url", s.ClientURL(), "--dynamodb-endpoint", d.Endpoint, "--table", table}
	c := startChild(t, append(settings, "--flush-interval", "100ms", "--windows", "1m,1h", "--log-level", "warn")...)

	// The load: five topics, published until the audit is done.
	topics := []string{"golang", "rust", "zig", "k8s", "nats"}
	stop := make(chan struct{})
	loaded := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				loaded <- nil
				return
			default:
			}
			if _, err := js.Publish(ctx, "mentions."+topics[i%len(topics)], []byte(`{"count":1}`)); err != nil {
				loaded <- err
				return
			}
		}
	}()
	testenv.Eventually(t, time.Minute, func() error {
		if n := c.metric(t, "hotcount_flusher_flushed_mentions_total"); n < 2000 {
			return fmt.Errorf("%v mentions written", n)
		}
		return nil
	})

	var stdout, stderr bytes.Buffer
	err = dispatch(ctx, append([]string{"audit", "--json", "--windows", "1m,1h"}, settings...), nil, &stdout, &stderr)
	close(stop)
	if lerr := <-loaded; lerr != nil {
		t.Fatal(lerr)
	}
	var rep struct {
		Differ   int64 `json:"differ"`
		InFlight int64 `json:"inFlight"`
		Totals   struct {
			Compared int64 `json:"compared"`
		} `json:"totals"`
		Buckets struct {
			Compared int64 `json:"compared"`
		} `json:"buckets"`
		Messages int64 `json:"messages"`
	}
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("audit printed no JSON (%v): %s%s", jerr, stdout.String(), stderr.String())
	}
	t.Logf("audit under load: %d messages read, %d totals and %d buckets compared, %d in flight, %d differ", rep.Messages, rep.Totals.Compared, rep.Buckets.Compared, rep.InFlight, rep.Differ)
	if err != nil || rep.Differ != 0 || rep.InFlight != 0 || rep.Totals.Compared != int64(len(topics)) || rep.Buckets.Compared < int64(2*len(topics)) {
		t.Errorf("audit while counting = %v: %d differ, %d in flight, %d totals and %d buckets compared; want none, none, %d and at least %d:\n%s",
			err, rep.Differ, rep.InFlight, rep.Totals.Compared, rep.Buckets.Compared, len(topics), 2*len(topics), stderr.String())
	}
}
