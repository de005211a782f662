package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// TestRegionsWriteOwnReadAll: two Regions' stores on one table (what a
// global table's replicas converge to). Each writes only its own items
// (totals, buckets, shard counts, history); each reads, as a total, a
// bucket, a shard count and a history start, every Region's and the
// single-Region layout's that the table had before.
func TestRegionsWriteOwnReadAll(t *testing.T) {
	ctx := context.Background()
	d := testenv.StartDynalite(t)
	table := d.Table(t, "hotcount")
	open := func(r schema.Regions) *store.DynamoDB {
		s := store.NewDynamoDB(d.Client(), table, store.NewMetrics(prometheus.NewRegistry()))
		s.Regions = r
		return s
	}
	old := open(schema.Regions{})
	east := open(schema.Regions{Own: "us-east-1", All: []string{"us-east-1", "eu-west-1"}})
	west := open(schema.Regions{Own: "eu-west-1", All: []string{"us-east-1"}}) // its own is read unlisted
	now := time.Now()
	minute := schema.BucketOf("t", schema.Minute, schema.Minute.Index(now))

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(old.Add(ctx, testenv.W("t", 0, 1), now)) // before the table went global
	must(east.Add(ctx, testenv.W("t", 0, 10), now))
	must(east.Add(ctx, testenv.Inc(minute, 0, 10), now))
	must(west.Add(ctx, testenv.W("t", 0, 100), now))
	must(west.Add(ctx, testenv.W("t", 1, 100), now))
	must(west.Add(ctx, testenv.Inc(minute, 1, 100), now))
	must(west.SetMeta(ctx, "t", schema.Meta{}, schema.Meta{Shards: 2, ReadShards: 2}))
	must(east.MarkHistory(ctx, now))
	must(west.MarkHistory(ctx, now.Add(-time.Hour)))

	// The items: each Region's own, the old shard untouched.
	counts, _ := d.Counts(t, table)
	if counts["t"] != 211 {
		t.Fatalf("the table's items of t sum to %d, want 211", counts["t"])
	}
	for _, pk := range []string{"TREND#t#0", "TREND#t#us-east-1.0", "TREND#t#eu-west-1.0", "TREND#t#eu-west-1.1", "TREND#t#eu-west-1.meta", "FLEET#us-east-1.history", "FLEET#eu-west-1.history"} {
		out, err := d.Client().GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: pk}}})
		must(err)
		if out.Item == nil {
			t.Errorf("item %s missing", pk)
		}
	}

	for name, s := range map[string]*store.DynamoDB{"us-east-1": east, "eu-west-1": west} {
		shards, err := s.Gather(ctx, "t", 1, true)
		must(err)
		if sum, _ := schema.Sum(shards); sum != 211 {
			t.Errorf("%s: total %d, want 211 (shards %+v)", name, sum, shards)
		}
		parts := schema.ByRegion(shards)
		want := map[string]int64{"": 1, "us-east-1": 10, "eu-west-1": 200}
		if len(parts) != len(want) {
			t.Errorf("%s: parts %+v", name, parts)
		}
		for _, p := range parts {
			if p.Count != want[p.Region] || p.UpdatedAt == 0 {
				t.Errorf("%s: part %+v, want count %d", name, p, want[p.Region])
			}
		}
		got, err := s.Counts(ctx, []string{minute.Key(0), minute.Key(1)}, true)
		must(err)
		if got[minute.Key(0)] != 10 || got[minute.Key(1)] != 100 {
			t.Errorf("%s: bucket counts %v, want shard 0: 10, shard 1: 100", name, got)
		}
		metas, err := s.Metas(ctx, []string{"t"})
		must(err)
		if m := metas["t"]; m.Read() != 2 {
			t.Errorf("%s: meta %+v reads %d shards, want 2 (the west's)", name, m, m.Read())
		}
		since, err := s.HistoryStart(ctx)
		must(err)
		if want := now.Add(-time.Hour).Truncate(time.Second); !since.Equal(want) {
			t.Errorf("%s: history starts %v, want the earliest Region's %v", name, since, want)
		}
	}
	// The east's own shard count is its own: no item yet, one shard, and
	// setting it does not touch the west's.
	metas, err := east.Metas(ctx, []string{"t"})
	must(err)
	if m := metas["t"]; m.Exists() || m.Write() != 1 || m.Elsewhere != 2 {
		t.Errorf("the east's meta %+v: want none of its own (1 shard to write), 2 elsewhere", m)
	}
	must(east.SetMeta(ctx, "t", metas["t"], metas["t"].With(4)))
	metas, err = west.Metas(ctx, []string{"t"})
	must(err)
	if m := metas["t"]; m.Shards != 2 || m.Elsewhere != 4 || m.Read() != 4 {
		t.Errorf("the west's meta %+v: want its own 2, the east's 4 elsewhere", m)
	}
}
