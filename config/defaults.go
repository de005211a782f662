package config

import (
	"time"

	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/httpapi"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/moderation"
	"github.com/hotcount/hotcount/pipeline/shardcount"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/pipeline/trend"
)

// Defaults that belong to no stage.
const (
	// DefaultNATSURL is the NATS server the sidecar connects to.
	DefaultNATSURL = "nats://127.0.0.1:4222"
	// DefaultStore is the store of `hotcount run`.
	DefaultStore = StoreDynamoDB
	// DefaultTable is the DynamoDB table.
	DefaultTable = "hotcount"
	// DefaultDataDir is the embedded store's folder.
	DefaultDataDir = "hotcount-data"
	// DefaultShutdownTimeout is the whole shutdown budget: the NATS drain,
	// the final flush and the HTTP shutdown. It fits inside Kubernetes'
	// default 30 s termination grace period with 5 s to spare.
	DefaultShutdownTimeout = 25 * time.Second
	// DefaultLogFormat is the log encoding of `hotcount run`.
	DefaultLogFormat = "json"
	// DefaultLogLevel is the lowest level logged.
	DefaultLogLevel = "info"
	// EnvPrefix starts every environment variable hotcount reads.
	EnvPrefix = "HOTCOUNT_"
)

// NATS modes.
const (
	ModeCore        = "core"
	ModeJetStream   = "jetstream"
	ModePartitioned = "partitioned"
)

// DefaultPartitions is partitioned mode's partition streams: enough for a
// fleet of 16 sidecars to each own one, and to spread the streams'
// leaders over a 3- or 5-node cluster; a larger fleet needs more (a
// sidecar beyond the partition count owns none and idles). Each partition
// is a stream, at R3 a Raft group on three servers with its consumer's: 16
// where the previous release's single stream had 64 filtered consumers.
const DefaultPartitions = 16

// Store kinds.
const (
	StoreDynamoDB = "dynamodb"
	StoreBolt     = "bolt"
)

// Time buckets' defaults.
const (
	// DefaultWindows is none for `run`: buckets cost writes (two more per
	// busy topic per flush with both), which a fleet upgrading must not
	// find on its bill unasked, and an embedded store under a long tail of
	// new topics cannot take (BenchmarkLongTail: a third of the pace).
	DefaultWindows = "none"
	// DevWindows turns minute and hour buckets on in `hotcount dev`.
	DevWindows = "1m,1h"
	// DefaultTrendSubject carries the flush summaries behind /v1/trending.
	DefaultTrendSubject = "hotcount.trend"
)

// Default returns the defaults of `hotcount run`.
func Default() Config {
	return Config{
		NATSURL:           DefaultNATSURL,
		NATSMode:          ModeCore,
		Stream:            ingest.DefaultStream,
		Partitions:        DefaultPartitions,
		Subject:           ingest.DefaultSubject,
		QueueGroup:        ingest.DefaultQueueGroup,
		DeadLetterSubject: ingest.DefaultDeadLetterSubject,
		ShareTotals:       "auto",
		ShareSubject:      fleet.DefaultSharesSubject,
		DrainTimeout:      ingest.DefaultDrainTimeout,
		Store:             DefaultStore,
		Table:             DefaultTable,
		DataDir:           DefaultDataDir,
		SpillMaxBytes:     "1Gi",
		Shards:            flusher.DefaultShards,
		Adaptive:          true,
		MaxShards:         shardcount.DefaultMax,
		ShardsCache:       shardcount.DefaultEvery,
		FlushInterval:     flusher.DefaultInterval,
		FlushTimeout:      flusher.DefaultTimeout,
		WriteTimeout:      flusher.DefaultWriteTimeout,
		QuarantineAfter:   flusher.DefaultQuarantineAfter,
		FlushConcurrency:  0, // by store: see FlushWrites
		MaxTopics:         aggregator.DefaultMaxTopics,
		MaxCount:          mention.DefaultMaxCount,
		MaxTopicBytes:     mention.DefaultMaxTopicBytes,
		CacheTTL:          lookup.DefaultCacheTTL,
		CacheSize:         lookup.DefaultCacheSize,
		Windows:           DefaultWindows,
		MinuteRetention:   store.DefaultMinuteRetention,
		HourRetention:     store.DefaultHourRetention,
		TrendSubject:      DefaultTrendSubject,
		TrendingBucket:    moderation.DefaultBucket,
		HTTPAddr:          httpapi.DefaultLookupAddr,
		AdminAddr:         httpapi.DefaultAdminAddr,
		ShutdownTimeout:   DefaultShutdownTimeout,
		LogFormat:         DefaultLogFormat,
		LogLevel:          DefaultLogLevel,

		TrendingBy:              string(trend.ByMentions),
		TrendingMinContributors: trend.DefaultMinContributors,
	}
}

// Dev returns the defaults of `hotcount dev`: JetStream on the embedded
// server (a restart loses nothing), the embedded store, both listeners on
// localhost, console logs.
func Dev() Config {
	c := Default()
	c.NATSMode = ModeJetStream
	c.Store = StoreBolt
	c.AdminAddr = "127.0.0.1:9091"
	c.LogFormat = "console"
	c.ConsoleRace = true
	c.Windows = DevWindows
	return c
}
