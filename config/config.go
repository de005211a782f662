// Package config is hotcount's configuration: one struct, every setting a
// command-line flag, a HOTCOUNT_* environment variable and a key of the YAML
// file given by --config. The command line wins over the environment, which
// wins over the file, which wins over the defaults. Unknown keys and unknown
// HOTCOUNT_* variables are errors, and Validate names the setting and its
// allowed range.
package config

import "time"

// Config is every setting of the sidecar.
type Config struct {
	NATSURL           string
	NATSMode          string
	NATSCreds         string
	NATSNKey          string
	NATSToken         string
	NATSTLSCA         string
	NATSTLSCert       string
	NATSTLSKey        string
	Stream            string
	Partitions        int
	Subject           string
	QueueGroup        string
	DeadLetterSubject string
	// ShareTotals is auto (on in JetStream mode), true or false.
	ShareTotals  string
	ShareSubject string
	DrainTimeout time.Duration

	Store            string
	Table            string
	DynamoDBEndpoint string
	DataDir          string
	// Region is the Region this sidecar writes its own shards in, on a
	// DynamoDB global table (schema.Regions); "": the SDK's Region when the
	// table is global or Regions is set, else the single-Region layout.
	Region string
	// Regions lists, comma-separated, every Region that writes the table,
	// for tables whose replicas DescribeTable does not list.
	Regions string

	Shards        int
	Adaptive      bool
	MaxShards     int
	ShardsCache   time.Duration
	FlushInterval time.Duration
	FlushTimeout  time.Duration
	WriteTimeout  time.Duration
	// QuarantineAfter is how long a counter's writes may be refused for
	// good before the write is quarantined; 0: never (tried forever).
	QuarantineAfter  time.Duration
	FlushConcurrency int
	MaxTopics        int
	MaxCount         int64
	MaxTopicBytes    int
	// MaxLateness bounds how long before its arrival (core mode) or
	// publication (durable modes) a mention's "at" may be; 0: Lateness's
	// default.
	MaxLateness time.Duration

	CacheTTL   time.Duration
	CacheStale time.Duration
	CacheSize  int

	// Windows lists the time buckets written besides the totals
	// (--windows): "1m,1h" (dev's default), "1m", "1h", or "none" (run's).
	Windows         string
	MinuteRetention time.Duration
	HourRetention   time.Duration
	// TrendSubject is where the sidecars publish what each flush wrote,
	// for the fleet-wide trending list.
	TrendSubject string
	// TrendingBy is what /v1/trending ranks by: mentions (the default) or
	// contributors; TrendingMinContributors the least distinct
	// contributors a topic needs in the window to trend by contributors.
	TrendingBy              string
	TrendingMinContributors int
	// TrendingBucket is the JetStream key-value bucket of the trending
	// list's moderation (package moderation).
	TrendingBucket string
	// TrendingReview lists a topic as trending only once an operator has
	// allowed it.
	TrendingReview bool

	HTTPAddr        string
	HTTPTokenFile   string
	HTTPPublic      bool
	AdminAddr       string
	HealthFlushAge  time.Duration
	ShutdownTimeout time.Duration

	LogFormat string
	LogLevel  string

	// ConsoleRace shows the race button on the admin listener's /console
	// (--console-race; on in hotcount dev).
	ConsoleRace bool
	// Pprof serves net/http/pprof at /debug/pprof on the admin listener
	// (--pprof), to this machine only unless the request carries the
	// lookup API's token.
	Pprof bool

	// MemoryLimit is the process's memory budget (--memory-limit): bytes,
	// with an optional Ki, Mi or Gi suffix; empty: the cgroup's limit;
	// "none": no limit.
	MemoryLimit string
	// BufferMemory is the window's memory budget (--buffer-memory): empty
	// for a quarter of GOMEMLIMIT (256 MiB without one), or "none".
	BufferMemory string
	// SpillMaxBytes bounds the spill folder (--spill-max-bytes); "0" turns
	// spilling off.
	SpillMaxBytes string

	// File is the YAML file the settings were read from, if any.
	File string
}
