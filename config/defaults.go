package config

import (
	"time"

	"github.com/hotcount/hotcount/mention"
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

// The stages' defaults. config names them here rather than import the
// stages, so that a program that reads the settings compiles none of them;
// where a stage needs a default of its own for a zero Config field, config's
// tests check that the two agree.
const (
	// DefaultStream is jetstream mode's stream of mentions.
	DefaultStream = "MENTIONS"
	// DefaultSubject is the subscription subject; the topic follows the
	// prefix.
	DefaultSubject = "mentions.>"
	// DefaultQueueGroup is the queue group core-mode sidecars share.
	DefaultQueueGroup = "hotcount"
	// DefaultDeadLetterSubject receives rejected messages.
	DefaultDeadLetterSubject = "hotcount.dlq"
	// DefaultShareSubject is the subject gathered totals are shared on.
	DefaultShareSubject = "hotcount.totals"
	// DefaultDrainTimeout bounds the drain of the subscription at shutdown.
	DefaultDrainTimeout = 5 * time.Second
	// DefaultShards is the number of shards a new topic starts with: one
	// (no metadata item, one row), raised when its writes are throttled.
	DefaultShards = 1
	// DefaultMaxShards is the most shards --adaptive raises a topic to.
	DefaultMaxShards = 64
	// DefaultShardsCache is how long a topic's shard count is trusted
	// before it is read again (--shards-cache).
	DefaultShardsCache = 30 * time.Second
	// DefaultFlushInterval is how often the window is flushed (before
	// jitter).
	DefaultFlushInterval = time.Second
	// DefaultFlushTimeout is how long a flush may go on starting writes;
	// writes not started by then wait for the next flush.
	DefaultFlushTimeout = 5 * time.Second
	// DefaultWriteTimeout bounds one write once started. A started write
	// is not cut off at the flush deadline; one that runs out of its own
	// time is in doubt, and is sent again unchanged.
	DefaultWriteTimeout = 5 * time.Second
	// DefaultQuarantineAfter is how long a counter's writes may be refused
	// for good before they move to the quarantine.
	DefaultQuarantineAfter = 5 * time.Minute
	// DefaultFlushConcurrency bounds the writes in flight at once against
	// DynamoDB. A flush runs as many as it has topics, up to this: a long
	// tail of new topics is written at the store's pace, not at 16 round
	// trips at a time. It matches the HTTP client's idle connections per
	// host.
	DefaultFlushConcurrency = 256
	// EmbeddedFlushConcurrency is the same bound against the embedded
	// store, whose writes are local: at 256 a long tail of 20,000 new
	// topics a second fell behind as the file grew (0.95× keep-up,
	// 141,000 topics unwritten when the load stopped); at 1,024 it kept
	// pace with about a second of backlog (BenchmarkLongTail).
	EmbeddedFlushConcurrency = 1024
	// DefaultMaxTopics bounds the distinct topics in one window.
	DefaultMaxTopics = 100_000
	// DefaultCacheTTL is how long a gathered total is served as fresh.
	DefaultCacheTTL = time.Second
	// DefaultStaleFactor sets the default --cache-stale: 10 × the TTL.
	DefaultStaleFactor = 10
	// DefaultCacheSize is how many topics' totals the cache holds.
	DefaultCacheSize = 10_000
	// DefaultMinuteRetention is how long minute buckets are kept: two
	// days, for windows up to a day and a day of baseline before them.
	DefaultMinuteRetention = 48 * time.Hour
	// DefaultHourRetention is how long hour buckets are kept: 35 days, for
	// windows up to a week with four weeks of baseline.
	DefaultHourRetention = 35 * 24 * time.Hour
	// DefaultTrendingBucket is the key-value bucket of the fleet's
	// moderation of the trending list.
	DefaultTrendingBucket = "hotcount_trending"
	// DefaultLookupAddr is the lookup API's listen address: localhost, for
	// the app in the same pod.
	DefaultLookupAddr = "127.0.0.1:8080"
	// DefaultAdminAddr is the admin listener's address: all interfaces,
	// so that the kubelet and Prometheus reach it.
	DefaultAdminAddr = ":9091"
	// TrendingByMentions and TrendingByContributors are what trending
	// ranks by (--trending-by).
	TrendingByMentions     = "mentions"
	TrendingByContributors = "contributors"
	// DefaultMinContributors is the least distinct contributors a topic
	// needs in the window to trend by contributors.
	DefaultMinContributors = 5
)

// Default returns the defaults of `hotcount run`.
func Default() Config {
	return Config{
		NATSURL:           DefaultNATSURL,
		NATSMode:          ModeCore,
		Stream:            DefaultStream,
		Partitions:        DefaultPartitions,
		Subject:           DefaultSubject,
		QueueGroup:        DefaultQueueGroup,
		DeadLetterSubject: DefaultDeadLetterSubject,
		ShareTotals:       "auto",
		ShareSubject:      DefaultShareSubject,
		DrainTimeout:      DefaultDrainTimeout,
		Store:             DefaultStore,
		Table:             DefaultTable,
		DataDir:           DefaultDataDir,
		SpillMaxBytes:     "1Gi",
		Shards:            DefaultShards,
		Adaptive:          true,
		MaxShards:         DefaultMaxShards,
		ShardsCache:       DefaultShardsCache,
		FlushInterval:     DefaultFlushInterval,
		FlushTimeout:      DefaultFlushTimeout,
		WriteTimeout:      DefaultWriteTimeout,
		QuarantineAfter:   DefaultQuarantineAfter,
		FlushConcurrency:  0, // by store: see FlushWrites
		MaxTopics:         DefaultMaxTopics,
		MaxCount:          mention.DefaultMaxCount,
		MaxTopicBytes:     mention.DefaultMaxTopicBytes,
		CacheTTL:          DefaultCacheTTL,
		CacheSize:         DefaultCacheSize,
		Windows:           DefaultWindows,
		MinuteRetention:   DefaultMinuteRetention,
		HourRetention:     DefaultHourRetention,
		TrendSubject:      DefaultTrendSubject,
		TrendingBucket:    DefaultTrendingBucket,
		HTTPAddr:          DefaultLookupAddr,
		AdminAddr:         DefaultAdminAddr,
		ShutdownTimeout:   DefaultShutdownTimeout,
		LogFormat:         DefaultLogFormat,
		LogLevel:          DefaultLogLevel,

		TrendingBy:              TrendingByMentions,
		TrendingMinContributors: DefaultMinContributors,
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
