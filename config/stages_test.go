package config_test

import (
	"fmt"
	"testing"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/moderation"
	"github.com/hotcount/hotcount/pipeline/shardcount"
	"github.com/hotcount/hotcount/pipeline/trend"
	"github.com/hotcount/hotcount/schema"
)

// TestDefaultsAgreeWithTheStages: config names the stages' defaults
// itself (it imports no stage), and a stage that needs one of its own, for
// a zero field of its Config or for its tests, has the same value.
func TestDefaultsAgreeWithTheStages(t *testing.T) {
	d := config.Default()
	for _, c := range []struct {
		name         string
		config, want any
	}{
		{"stream", d.Stream, ingest.DefaultStream},
		{"dead-letter subject", d.DeadLetterSubject, ingest.DefaultDeadLetterSubject},
		{"share subject", d.ShareSubject, fleet.DefaultSharesSubject},
		{"max topics", d.MaxTopics, aggregator.DefaultMaxTopics},
		{"max shards", d.MaxShards, shardcount.DefaultMax},
		{"shards cache", d.ShardsCache, shardcount.DefaultEvery},
		{"quarantine after", d.QuarantineAfter, flusher.DefaultQuarantineAfter},
		{"write timeout", d.WriteTimeout, flusher.DefaultWriteTimeout},
		{"trending bucket", d.TrendingBucket, moderation.DefaultBucket},
		{"min contributors", d.TrendingMinContributors, trend.DefaultMinContributors},
		{"trending by", d.TrendingBy, string(trend.ByMentions)},
		{"by contributors", config.TrendingByContributors, string(trend.ByContributors)},
		{"minute retention", d.MinuteRetention, schema.DefaultMinuteRetention},
		{"hour retention", d.HourRetention, schema.DefaultHourRetention},
		{"the client's subject", d.Subject, client.DefaultSubjectPrefix + ">"},
		{"the client's URL", "http://" + d.HTTPAddr, client.DefaultURL},
	} {
		if fmt.Sprint(c.config) != fmt.Sprint(c.want) {
			t.Errorf("%s: config's default %v, the stage's %v", c.name, c.config, c.want)
		}
	}
}
