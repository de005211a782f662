// Package config is hotcount's configuration: one struct, every setting a
// command-line flag, a HOTCOUNT_* environment variable and a key of the YAML
// file given by --config. The command line wins over the environment, which
// wins over the file, which wins over the defaults. Unknown keys and unknown
// HOTCOUNT_* variables are errors, and Validate names the setting and its
// allowed range.
package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"

	"github.com/hotcount/hotcount/admin"
	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/flusher"
	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/lookup"
	"github.com/hotcount/hotcount/shardcount"
	"github.com/hotcount/hotcount/store"
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

// Config is every setting of the sidecar.
type Config struct {
	NATSURL     string
	NATSMode    string
	NATSCreds   string
	NATSNKey    string
	NATSToken   string
	NATSTLSCA   string
	NATSTLSCert string
	NATSTLSKey  string
	Stream      string
	// Consumer is the durable consumer the previous engine (the journal)
	// read with: `hotcount stream adopt` and the engine's start-up check
	// look for it.
	Consumer string
	// AckWait and MaxAckPending are read by nothing since the durable
	// modes send no acknowledgements: accepted so that an old
	// configuration still starts.
	AckWait       time.Duration
	MaxAckPending int
	// DurableEngine is how the durable modes count exactly once; the one
	// engine left is EnginePosition (package durable: stream positions in
	// the items). The setting stays so that a configuration pinned to the
	// removed journal engine fails with what to run.
	DurableEngine     string
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
	// DynamoDB global table (store.Regions); "": the SDK's Region when the
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

// Default returns the defaults of `hotcount run`.
func Default() Config {
	return Config{
		NATSURL:           DefaultNATSURL,
		NATSMode:          ModeCore,
		Stream:            ingest.DefaultStream,
		Consumer:          ingest.DefaultConsumer,
		AckWait:           ingest.DefaultAckWait,
		MaxAckPending:     ingest.DefaultMaxAckPending,
		DurableEngine:     EnginePosition,
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
		MaxCount:          ingest.DefaultMaxCount,
		MaxTopicBytes:     ingest.DefaultMaxTopicBytes,
		CacheTTL:          lookup.DefaultCacheTTL,
		CacheSize:         lookup.DefaultCacheSize,
		Windows:           DefaultWindows,
		MinuteRetention:   store.DefaultMinuteRetention,
		HourRetention:     store.DefaultHourRetention,
		TrendSubject:      DefaultTrendSubject,
		HTTPAddr:          lookup.DefaultAddr,
		AdminAddr:         admin.DefaultAddr,
		ShutdownTimeout:   DefaultShutdownTimeout,
		LogFormat:         DefaultLogFormat,
		LogLevel:          DefaultLogLevel,
	}
}

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

// Buckets says which time buckets --windows turns on.
func (c Config) Buckets() (minutes, hours bool) {
	for _, w := range strings.Split(c.Windows, ",") {
		switch strings.TrimSpace(w) {
		case "1m":
			minutes = true
		case "1h":
			hours = true
		}
	}
	return minutes, hours
}

// Lateness is the bound of a mention's "at" in the past: --max-lateness,
// or when it is 0, ingest.DefaultMaxLateness (24h), lowered to
// --minute-retention when minute buckets are on and kept for less.
func (c Config) Lateness() time.Duration {
	if c.MaxLateness > 0 {
		return c.MaxLateness
	}
	if minutes, _ := c.Buckets(); minutes && c.MinuteRetention > 0 && c.MinuteRetention < ingest.DefaultMaxLateness {
		return c.MinuteRetention
	}
	return ingest.DefaultMaxLateness
}

// FlushWrites is the most writes a flush keeps in flight: --flush-concurrency,
// or when it is 0, the default for the store.
func (c Config) FlushWrites() int {
	switch {
	case c.FlushConcurrency > 0:
		return c.FlushConcurrency
	case c.Store == StoreBolt:
		return flusher.EmbeddedConcurrency
	default:
		return flusher.DefaultConcurrency
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

// setting describes one setting. Its flag name is also its YAML key.
type setting struct {
	name   string
	was    string // the variable's former name, still read with a warning
	usage  string
	bind   func(fs *pflag.FlagSet, c *Config, name, usage string)
	secret bool // never printed
}

func str(field func(*Config) *string) func(*pflag.FlagSet, *Config, string, string) {
	return func(fs *pflag.FlagSet, c *Config, name, usage string) {
		p := field(c)
		fs.StringVar(p, name, *p, usage)
	}
}

func integer(field func(*Config) *int) func(*pflag.FlagSet, *Config, string, string) {
	return func(fs *pflag.FlagSet, c *Config, name, usage string) {
		p := field(c)
		fs.IntVar(p, name, *p, usage)
	}
}

func dur(field func(*Config) *time.Duration) func(*pflag.FlagSet, *Config, string, string) {
	return func(fs *pflag.FlagSet, c *Config, name, usage string) {
		p := field(c)
		fs.DurationVar(p, name, *p, usage)
	}
}

// settings lists every setting, in the order --help shows them.
var settings = []setting{
	{name: "nats-url", usage: "NATS server URL(s), comma-separated", bind: str(func(c *Config) *string { return &c.NATSURL })},
	{name: "nats-mode", usage: "core (at most once: a crash loses the buffer), jetstream (a durable consumer shared by the fleet; exactly once) or partitioned (jetstream with the stream partitioned by topic and each partition consumed by one sidecar, so the fleet writes a hot topic once per flush)", bind: str(func(c *Config) *string { return &c.NATSMode })},
	{name: "nats-creds", usage: "NATS credentials file (JWT and NKey seed)", bind: str(func(c *Config) *string { return &c.NATSCreds })},
	{name: "nats-nkey", usage: "NATS NKey seed file", bind: str(func(c *Config) *string { return &c.NATSNKey })},
	{name: "nats-token", usage: "NATS authentication token (prefer the environment variable; never printed)", bind: str(func(c *Config) *string { return &c.NATSToken }), secret: true},
	{name: "nats-tls-ca", usage: "CA certificate file that signed the NATS server's certificate", bind: str(func(c *Config) *string { return &c.NATSTLSCA })},
	{name: "nats-tls-cert", usage: "client certificate file for NATS mutual TLS (with --nats-tls-key)", bind: str(func(c *Config) *string { return &c.NATSTLSCert })},
	{name: "nats-tls-key", usage: "client key file for NATS mutual TLS (with --nats-tls-cert)", bind: str(func(c *Config) *string { return &c.NATSTLSKey })},
	{name: "stream", usage: "JetStream stream of mentions (jetstream mode)", bind: str(func(c *Config) *string { return &c.Stream })},
	{name: "consumer", usage: "the durable consumer the previous release's journal engine read the stream with: hotcount stream adopt checkpoints at its acknowledgement floor, and a sidecar refuses a stream it read past the checkpoint", bind: str(func(c *Config) *string { return &c.Consumer })},
	{name: "ack-wait", usage: "not read any more (the durable modes send no acknowledgements); accepted so that an old configuration starts", bind: dur(func(c *Config) *time.Duration { return &c.AckWait })},
	{name: "max-ack-pending", usage: "not read any more (the durable modes send no acknowledgements); accepted so that an old configuration starts", bind: integer(func(c *Config) *int { return &c.MaxAckPending })},
	{name: "durable-engine", usage: "how the durable modes count exactly once: position, the one engine (each item records the last stream sequence it includes, writes apply only past it, partitions are read without acknowledgements from a checkpoint; docs/SEMANTICS.md); journal, the previous release's engine, is refused with what to run", bind: str(func(c *Config) *string { return &c.DurableEngine })},
	{name: "partitions", usage: "partitioned mode: partition streams, one per partition (hotcount stream create sets them up, the NATS server's mapping routes into them); at least the fleet's size", bind: integer(func(c *Config) *int { return &c.Partitions })},
	{name: "subject", usage: "subject of mentions, <prefix>.>: the sidecar subscribes to it, load publishes to <prefix>.<topic>; the topic is what follows the prefix", bind: str(func(c *Config) *string { return &c.Subject })},
	{name: "queue-group", usage: "NATS queue group shared by the sidecars", bind: str(func(c *Config) *string { return &c.QueueGroup })},
	{name: "share-totals", usage: "share gathered totals with the other sidecars over NATS, so that the fleet gathers a hot topic about once per TTL instead of once per sidecar: auto (on in jetstream mode), true or false", bind: str(func(c *Config) *string { return &c.ShareTotals })},
	{name: "share-subject", usage: "subject the sidecars share gathered totals on", bind: str(func(c *Config) *string { return &c.ShareSubject })},
	{name: "dead-letter-subject", usage: "subject that rejected messages are republished to (empty: none)", bind: str(func(c *Config) *string { return &c.DeadLetterSubject })},
	{name: "drain-timeout", usage: "at shutdown, how long the NATS drain may take", bind: dur(func(c *Config) *time.Duration { return &c.DrainTimeout })},
	{name: "store", usage: "store: dynamodb, or bolt (embedded, in --data-dir)", bind: str(func(c *Config) *string { return &c.Store })},
	{name: "table", usage: "DynamoDB table", bind: str(func(c *Config) *string { return &c.Table })},
	{name: "dynamodb-endpoint", usage: "DynamoDB endpoint URL (empty: AWS's own; set for dynalite, DynamoDB Local, LocalStack)", bind: str(func(c *Config) *string { return &c.DynamoDBEndpoint })},
	{name: "region", usage: "on a DynamoDB global table: the Region whose own shards this sidecar writes (no two Regions write one item, so last-writer-wins replication loses nothing); empty: the AWS Region the SDK resolves, when DescribeTable lists replicas or --regions is set, else the single-Region layout", bind: str(func(c *Config) *string { return &c.Region })},
	{name: "regions", usage: "every Region that writes the table, comma-separated, read by every total (needed where DescribeTable lists no replicas: DynamoDB Local, dynalite, a policy without dynamodb:DescribeTable); the table's replicas are added", bind: str(func(c *Config) *string { return &c.Regions })},
	{name: "data-dir", usage: "folder of the embedded store (--store bolt)", bind: str(func(c *Config) *string { return &c.DataDir })},
	{name: "shards", usage: fmt.Sprintf("shards of a new topic, 1..%d (a topic keeps the count recorded when it was first written: see docs/SIZING.md)", store.MaxShards), bind: integer(func(c *Config) *int { return &c.Shards })},
	{name: "adaptive", usage: "double a topic's shards (up to max-shards) when its writes are throttled (on by default; --adaptive=false keeps every topic at its first count)", bind: func(fs *pflag.FlagSet, c *Config, name, usage string) {
		fs.BoolVar(&c.Adaptive, name, c.Adaptive, usage)
	}},
	{name: "max-shards", usage: "the most shards --adaptive raises a topic to", bind: integer(func(c *Config) *int { return &c.MaxShards })},
	{name: "shards-cache", usage: "how long a writer trusts its copy of a topic's shard count, and the least time between two raises of a topic by one sidecar", bind: dur(func(c *Config) *time.Duration { return &c.ShardsCache })},
	{name: "flush-interval", usage: "how often buffered deltas are written (±10% jitter)", bind: dur(func(c *Config) *time.Duration { return &c.FlushInterval })},
	{name: "flush-timeout", usage: "how long one flush may go on starting writes; the rest wait for the next flush", bind: dur(func(c *Config) *time.Duration { return &c.FlushTimeout })},
	{name: "write-timeout", usage: "how long one store write may take, the SDK's retries included; a write that runs out is in doubt and is sent again unchanged", bind: dur(func(c *Config) *time.Duration { return &c.WriteTimeout })},
	{name: "quarantine-after", usage: "how long a counter's writes may be refused for good (AccessDenied, Validation, overflow), never in doubt, before the write moves to the quarantine (the data directory in core mode, a JetStream bucket otherwise) and stops holding its topic; 0: never, tried forever", bind: dur(func(c *Config) *time.Duration { return &c.QuarantineAfter })},
	{name: "flush-concurrency", usage: "the most writes in flight at once during a flush (a flush runs as many as it has topics, up to this); 0: 256 against DynamoDB, 1024 against the embedded store, whose writes in flight commit together", bind: integer(func(c *Config) *int { return &c.FlushConcurrency })},
	{name: "max-topics", usage: "distinct topics in one window before an early flush", bind: integer(func(c *Config) *int { return &c.MaxTopics })},
	{name: "max-count", usage: "largest count one message may add", bind: func(fs *pflag.FlagSet, c *Config, name, usage string) {
		fs.Int64Var(&c.MaxCount, name, c.MaxCount, usage)
	}},
	{name: "max-topic-bytes", usage: "longest topic accepted, in bytes", bind: integer(func(c *Config) *int { return &c.MaxTopicBytes })},
	{name: "max-lateness", usage: `how long before its arrival (core mode) or publication (jetstream, partitioned) a mention's "at" may be; an older one, or one over a minute ahead, is rejected (reason "at"); 0: 24h, or the minute-retention if shorter with 1m windows`, bind: dur(func(c *Config) *time.Duration { return &c.MaxLateness })},
	{name: "cache-ttl", usage: "how long a gathered total is served from the cache", bind: dur(func(c *Config) *time.Duration { return &c.CacheTTL })},
	{name: "cache-stale", usage: "past the TTL, a total is served stale while one background gather refreshes it, up to this age (0: 10 × cache-ttl)", bind: dur(func(c *Config) *time.Duration { return &c.CacheStale })},
	{name: "cache-size", usage: "topics whose totals the cache holds", bind: integer(func(c *Config) *int { return &c.CacheSize })},
	{name: "windows", usage: "time buckets counted besides each topic's total, for ?window= reads and /v1/trending: 1m,1h (dev's default), 1m, 1h, or none (run's default); each costs one more write per busy topic per flush", bind: str(func(c *Config) *string { return &c.Windows })},
	{name: "minute-retention", usage: "how long minute buckets are kept (their DynamoDB TTL); windows up to 3h (and up to this) read minutes, longer ones hours", bind: dur(func(c *Config) *time.Duration { return &c.MinuteRetention })},
	{name: "hour-retention", usage: "how long hour buckets are kept (their DynamoDB TTL): the longest window", bind: dur(func(c *Config) *time.Duration { return &c.HourRetention })},
	{name: "trend-subject", usage: "subject the sidecars publish each flush's summary on, from which every sidecar ranks /v1/trending for the whole fleet", bind: str(func(c *Config) *string { return &c.TrendSubject })},
	{name: "http", was: EnvPrefix + "HTTP_ADDR", usage: "listen address of the lookup API", bind: str(func(c *Config) *string { return &c.HTTPAddr })},
	{name: "http-token-file", usage: "file holding the bearer token the lookup API requires (Authorization: Bearer <token>); empty: none, allowed only on a loopback --http or with --http-public", bind: str(func(c *Config) *string { return &c.HTTPTokenFile })},
	{name: "memory-limit", usage: "the process's memory budget (GOMEMLIMIT is set to 90% of it): bytes with an optional Ki, Mi or Gi suffix; empty: the container's cgroup limit, if any; none: no limit", bind: str(func(c *Config) *string { return &c.MemoryLimit })},
	{name: "buffer-memory", usage: "memory the buffered window may take (topic names plus 32 B each) before it is flushed early, spilled (core mode) or fetching pauses (JetStream mode): bytes with an optional Ki, Mi or Gi suffix; empty: an eighth of the memory limit, or 256Mi with none; none: no bound", bind: str(func(c *Config) *string { return &c.BufferMemory })},
	{name: "spill-max-bytes", usage: "core mode: disk the window may spill to, in --data-dir/spill, while the store does not take writes; past it mentions are shed and counted; 0: no spill", bind: str(func(c *Config) *string { return &c.SpillMaxBytes })},
	{name: "http-public", usage: "serve the lookup API beyond this machine without a token (anyone who can reach --http reads every count), and, with no --http-token-file, the data of the console on --admin too", bind: func(fs *pflag.FlagSet, c *Config, name, usage string) {
		fs.BoolVar(&c.HTTPPublic, name, c.HTTPPublic, usage)
	}},
	{name: "admin", was: EnvPrefix + "ADMIN_ADDR", usage: "listen address of /healthz, /readyz and /metrics", bind: str(func(c *Config) *string { return &c.AdminAddr })},
	{name: "health-flush-age", usage: "/healthz fails when no flush has written anything of its work for longer than this (0: 5 flush intervals)", bind: dur(func(c *Config) *time.Duration { return &c.HealthFlushAge })},
	{name: "shutdown-timeout", usage: "whole shutdown budget: NATS drain, final flush, HTTP shutdown", bind: dur(func(c *Config) *time.Duration { return &c.ShutdownTimeout })},
	{name: "log-format", usage: "log encoding: json or console", bind: str(func(c *Config) *string { return &c.LogFormat })},
	{name: "log-level", usage: "lowest level logged: debug, info, warn, error", bind: str(func(c *Config) *string { return &c.LogLevel })},
	{name: "console-race", usage: "offer the race on the admin listener's /console: direct writes against coalesced ones, on a throwaway in-memory store with an emulated per-key ceiling (never the real store); on in hotcount dev", bind: func(fs *pflag.FlagSet, c *Config, name, usage string) {
		fs.BoolVar(&c.ConsoleRace, name, c.ConsoleRace, usage)
	}},
	{name: "config", usage: "YAML file of settings, keyed by flag name", bind: str(func(c *Config) *string { return &c.File })},
}

func (s setting) envName() string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(s.name, "-", "_"))
}

// FlagSet returns a flag set for command name bound to c's fields, whose
// current values are the defaults. With take set, only the settings it
// accepts are in it. Each flag's help names its environment variable.
func (c *Config) FlagSet(name string, take func(setting string) bool) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	for _, s := range settings {
		if take != nil && !take(s.name) {
			continue
		}
		s.bind(fs, c, s.name, s.usage+" ($"+s.envName()+")")
	}
	return fs
}

// Parse fills fs's settings from args, environ (os.Environ's form) and the
// YAML file named by --config or HOTCOUNT_CONFIG. Flags of fs that are not
// settings (a command's own) are parsed from args only. An error names
// where the bad value came from: the variable or the file (pflag names the
// flag).
func Parse(fs *pflag.FlagSet, args, environ []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Noted before the file and the environment set anything, as both mark
	// the flags they set changed too.
	onCommandLine := make(map[string]bool)
	fs.Visit(func(f *pflag.Flag) { onCommandLine[f.Name] = true })

	path := configPath(fs, environ)
	fromFile, err := readFile(fs, path)
	if err != nil {
		return err
	}
	fromEnv, varOf, err := readEnv(fs, environ)
	if err != nil {
		return err
	}
	// The command line wins over the environment, which wins over the
	// file: set the file's values first.
	if err := setFrom(fs, fromFile, onCommandLine, func(key string) string { return path + ": " + key }); err != nil {
		return err
	}
	return setFrom(fs, fromEnv, onCommandLine, func(key string) string { return "$" + varOf[key] })
}

// configPath is the YAML file to read: --config, else HOTCOUNT_CONFIG (the
// last one in environ), else none ("").
func configPath(fs *pflag.FlagSet, environ []string) string {
	f := fs.Lookup("config")
	if f == nil {
		return ""
	}
	path := f.Value.String()
	if !f.Changed {
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, EnvPrefix+"CONFIG="); ok {
				path = v
			}
		}
	}
	return path
}

// readFile reads the YAML file at path (none when path is empty), keeping
// only the settings fs takes. A key that is no setting is an error.
func readFile(fs *pflag.FlagSet, path string) (*koanf.Koanf, error) {
	fromFile := koanf.New(".") // no setting's name has a dot: a nested key is unknown
	if path == "" {
		return fromFile, nil
	}
	if err := fromFile.Load(file.Provider(path), yaml.Parser()); err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	for _, key := range fromFile.Keys() {
		_, known := lookupSetting(key)
		switch {
		case !known || key == "config":
			return nil, fmt.Errorf("config: %s: unknown setting %q", path, key)
		case fs.Lookup(key) == nil:
			// A setting of another command: one file serves them all,
			// as the environment does.
			fromFile.Delete(key)
		}
	}
	return fromFile, nil
}

// readEnv reads the HOTCOUNT_* variables of environ, deprecated names
// renamed, keeping only the settings fs takes. varOf maps each setting read
// to the variable it came from. A HOTCOUNT_* variable that is no setting is
// an error.
func readEnv(fs *pflag.FlagSet, environ []string) (fromEnv *koanf.Koanf, varOf map[string]string, err error) {
	byEnv := make(map[string]string, len(settings))
	for _, s := range settings {
		byEnv[s.envName()] = s.name
	}
	fromEnv, varOf = koanf.New("."), make(map[string]string)
	var unknown []string
	if err := fromEnv.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return current(environ) },
		TransformFunc: func(key, v string) (string, any) {
			name, ok := byEnv[key]
			if !ok {
				unknown = append(unknown, key)
				return "", nil
			}
			if fs.Lookup(name) == nil || name == "config" {
				return "", nil // a setting this command does not take
			}
			varOf[name] = key
			return name, v
		},
	}), nil); err != nil {
		return nil, nil, fmt.Errorf("config: environment: %w", err)
	}
	if len(unknown) > 0 {
		return nil, nil, unknownVars(unknown, byEnv)
	}
	return fromEnv, varOf, nil
}

// unknownVars is the error for HOTCOUNT_* variables that are no setting,
// each with the known variable it is likely a typo of, if any.
func unknownVars(unknown []string, byEnv map[string]string) error {
	slices.Sort(unknown)
	for i, key := range unknown {
		if near := nearest(key, byEnv); near != "" {
			unknown[i] += " (did you mean " + near + "?)"
		}
	}
	return fmt.Errorf("config: unknown environment variable(s) %s: each is %s and a flag's name in capitals with - as _, as --help shows", strings.Join(unknown, ", "), EnvPrefix)
}

// setFrom sets fs's flags to src's values, but for those set on the
// command line, which wins. from names where a key's value came from, for
// the error when one does not parse.
func setFrom(fs *pflag.FlagSet, src *koanf.Koanf, onCommandLine map[string]bool, from func(key string) string) error {
	for key, v := range src.All() {
		if onCommandLine[key] {
			continue
		}
		if err := fs.Set(key, fmt.Sprint(v)); err != nil {
			return fmt.Errorf("config: %s: %q is not %s (--%s)", from(key), fmt.Sprint(v), kind(fs.Lookup(key)), key)
		}
	}
	return nil
}

// kind says in words what a flag's value must be.
func kind(f *pflag.Flag) string {
	switch f.Value.Type() {
	case "int", "int64":
		return "a whole number"
	case "duration":
		return "a duration such as 500ms, 2s or 1m"
	case "bool":
		return "true or false"
	default:
		return "a valid " + f.Value.Type()
	}
}

// current returns environ with each deprecated variable renamed to its
// setting's current one, unless that is set too (it wins).
func current(environ []string) []string {
	set := make(map[string]bool, len(environ))
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		name, v, _ := strings.Cut(kv, "=")
		for _, s := range settings {
			if s.was != "" && name == s.was {
				if set[s.envName()] {
					name = "" // dropped: the current name is set
				} else {
					name = s.envName()
				}
			}
		}
		if name != "" {
			out = append(out, name+"="+v)
		}
	}
	return out
}

// Deprecated returns a warning for each variable in environ under a name
// that still works for now but will not in the next release.
func Deprecated(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		for _, s := range settings {
			if s.was != "" && name == s.was {
				out = append(out, fmt.Sprintf("%s is deprecated and will be refused in the next release: rename it %s", s.was, s.envName()))
			}
		}
	}
	return out
}

// nearest returns the known variable closest to an unknown one, if one is
// a likely typo or a former name (at most 3 edits apart).
func nearest(key string, known map[string]string) string {
	best, bestD := "", 4
	for k := range known {
		if d := edits(key, k); d < bestD || (d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	return best
}

// edits is the Levenshtein distance between a and b.
func edits(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// Explain adds to each of Validate's complaints where its value came from,
// when that was not the command line: "(from $HOTCOUNT_SHARDS)" or "(from
// the --config file)". fs is the flag set Parse filled from environ.
func Explain(err error, fs *pflag.FlagSet, args, environ []string) error {
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		return err
	}
	onCommandLine := make(map[string]bool)
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "--") {
			onCommandLine[name] = true
		}
	}
	env := make(map[string]string, len(environ))
	for _, kv := range current(environ) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	var out []error
	for _, e := range joined.Unwrap() {
		name, _, _ := strings.Cut(e.Error(), ":")
		s, found := lookupSetting(name)
		switch {
		case !found || onCommandLine[name]:
		case env[s.envName()] != "":
			e = fmt.Errorf("%w (from $%s)", e, s.envName())
		case fs.Changed(name):
			e = fmt.Errorf("%w (from the --config file)", e)
		}
		out = append(out, e)
	}
	return fmt.Errorf("config: %w", errors.Join(out...))
}

func lookupSetting(name string) (setting, bool) {
	for _, s := range settings {
		if s.name == name {
			return s, true
		}
	}
	return setting{}, false
}

// jsName is the rule for JetStream stream and consumer names.
var jsName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,255}$`)

// tableName is DynamoDB's rule for table names.
var tableName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{3,255}$`)

// Validate checks every setting and reports all problems at once, each
// naming the setting and what it allows.
func (c *Config) Validate() error {
	var p problems
	prefix := c.checkNATS(&p)
	c.checkStore(&p)
	c.checkFlush(&p)
	c.checkCache(&p)
	c.checkWindows(&p, prefix)
	c.checkListeners(&p)
	c.checkShutdown(&p)
	c.checkMemory(&p)
	c.checkLogging(&p)
	if len(p) > 0 {
		return fmt.Errorf("config: %w", errors.Join(p...))
	}
	return nil
}

// problems collects Validate's complaints, so that one run reports them all
// rather than making the user fix one setting at a time.
type problems []error

// bad records a complaint about setting name.
func (p *problems) bad(name, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: "+format, append([]any{name}, args...)...))
}

// durIn complains when d is outside lo..hi.
func (p *problems) durIn(name string, d, lo, hi time.Duration) {
	if d < lo || d > hi {
		p.bad(name, "%s is outside %s..%s", d, lo, hi)
	}
}

// intIn complains when v is outside lo..hi.
func (p *problems) intIn(name string, v, lo, hi int64) {
	if v < lo || v > hi {
		p.bad(name, "%d is outside %d..%d", v, lo, hi)
	}
}

// addr complains when v is not a listen address.
func (p *problems) addr(name, v string) {
	if _, _, err := net.SplitHostPort(v); err != nil {
		p.bad(name, "%q is not host:port: %v", v, err)
	}
}

// checkNATS checks the connection to NATS and what the sidecar reads from
// it. It returns the subscription's subject prefix ("" when the subject is
// bad), which the subjects the sidecar publishes on must stay out of.
func (c *Config) checkNATS(p *problems) (prefix string) {
	if c.NATSURL == "" {
		p.bad("nats-url", "must not be empty")
	}
	c.checkNATSMode(p)
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		p.bad("nats-tls-cert", "and nats-tls-key go together")
	}
	if c.NATSCreds != "" && c.NATSNKey != "" {
		p.bad("nats-creds", "and nats-nkey are two ways to authenticate: choose one")
	}
	prefix = c.checkSubjects(p)
	p.durIn("drain-timeout", c.DrainTimeout, 0, time.Minute)
	return prefix
}

// checkNATSMode checks the mode and, in the durable modes, the JetStream
// settings they use.
func (c *Config) checkNATSMode(p *problems) {
	switch c.NATSMode {
	case ModeCore:
	case ModeJetStream, ModePartitioned:
		if !jsName.MatchString(c.Stream) {
			p.bad("stream", "%q is not a JetStream name (letters, digits, - and _)", c.Stream)
		}
		if !jsName.MatchString(c.Consumer) {
			p.bad("consumer", "%q is not a JetStream name (letters, digits, - and _)", c.Consumer)
		}
		switch c.DurableEngine {
		case EnginePosition:
		case "journal":
			p.bad("durable-engine", "the journal engine is gone: run the sidecars with position (the default), after `hotcount stream adopt` on streams the journal read (docs/SEMANTICS.md, \"Upgrading from the journal\")")
		default:
			p.bad("durable-engine", "%q is not %s", c.DurableEngine, EnginePosition)
		}
		if c.NATSMode == ModePartitioned {
			p.intIn("partitions", int64(c.Partitions), 1, 1024)
		}
	default:
		p.bad("nats-mode", "%q is not %s, %s or %s", c.NATSMode, ModeCore, ModeJetStream, ModePartitioned)
	}
}

// checkSubjects checks the subscription, the queue group and the subjects
// the sidecar publishes rejects and shared totals on, and returns the
// subscription's prefix.
func (c *Config) checkSubjects(p *problems) string {
	prefix, err := ingest.Prefix(c.Subject)
	if err != nil {
		p.bad("subject", "%v", err)
	}
	if c.QueueGroup == "" {
		p.bad("queue-group", "must not be empty (every sidecar would get every mention)")
	}
	if c.DeadLetterSubject != "" && prefix != "" && strings.HasPrefix(c.DeadLetterSubject, prefix) {
		p.bad("dead-letter-subject", "%q is under the subscription %q: rejects would come back as mentions", c.DeadLetterSubject, c.Subject)
	}
	switch c.ShareTotals {
	case "auto", "true", "false":
	default:
		p.bad("share-totals", "%q is not auto, true or false", c.ShareTotals)
	}
	if c.SharesTotals() {
		if c.ShareSubject == "" || strings.ContainsAny(c.ShareSubject, "*> \t") {
			p.bad("share-subject", "%q is not a plain NATS subject", c.ShareSubject)
		} else if prefix != "" && strings.HasPrefix(c.ShareSubject, prefix) {
			p.bad("share-subject", "%q is under the subscription %q: shared totals would come back as mentions", c.ShareSubject, c.Subject)
		}
	}
	return prefix
}

// checkStore checks the store kind and where its data lives.
func (c *Config) checkStore(p *problems) {
	switch c.Store {
	case StoreDynamoDB:
		if !tableName.MatchString(c.Table) {
			p.bad("table", "%q is not a DynamoDB table name (3..255 of a-z A-Z 0-9 _ . -)", c.Table)
		}
		for _, r := range c.RegionList() {
			if err := store.ValidateRegion(r); err != nil {
				p.bad("regions", "%v", err)
			}
		}
		if c.Region != "" {
			if err := store.ValidateRegion(c.Region); err != nil {
				p.bad("region", "%v", err)
			}
		}
	case StoreBolt:
		if c.DataDir == "" {
			p.bad("data-dir", "must not be empty with --store bolt")
		}
		if c.Region != "" || c.Regions != "" {
			p.bad("region", "Regions are a DynamoDB global table's; the embedded store has one")
		}
	default:
		p.bad("store", "%q is not %s or %s", c.Store, StoreDynamoDB, StoreBolt)
	}
}

// RegionList is Regions as a list, without blanks.
func (c *Config) RegionList() []string {
	var out []string
	for _, r := range strings.Split(c.Regions, ",") {
		if r = strings.TrimSpace(r); r != "" {
			out = append(out, r)
		}
	}
	return out
}

// checkFlush checks the shards, the flush's timing and the bounds on what
// one mention may carry.
func (c *Config) checkFlush(p *problems) {
	p.intIn("shards", int64(c.Shards), 1, store.MaxShards)
	p.intIn("max-shards", int64(c.MaxShards), 1, store.MaxShards)
	p.durIn("shards-cache", c.ShardsCache, 10*time.Millisecond, time.Hour)
	p.durIn("flush-interval", c.FlushInterval, 10*time.Millisecond, time.Hour)
	p.durIn("flush-timeout", c.FlushTimeout, time.Millisecond, time.Hour)
	p.durIn("write-timeout", c.WriteTimeout, 10*time.Millisecond, time.Minute)
	if c.QuarantineAfter != 0 {
		p.durIn("quarantine-after", c.QuarantineAfter, time.Second, 7*24*time.Hour)
	}
	p.intIn("flush-concurrency", int64(c.FlushConcurrency), 0, 1024)
	p.intIn("max-topics", int64(c.MaxTopics), 1, 100_000_000)
	p.intIn("max-count", c.MaxCount, 1, 1<<53)
	p.intIn("max-topic-bytes", int64(c.MaxTopicBytes), 1, 1024)
	p.durIn("max-lateness", c.MaxLateness, 0, 400*24*time.Hour)
	if minutes, hours := c.Buckets(); c.MaxLateness > 0 {
		// A mention older than its buckets' retention would go to a bucket
		// already expired: refused, rather than counted where no read finds it.
		switch {
		case minutes && c.MaxLateness > c.MinuteRetention:
			p.bad("max-lateness", "%s is longer than minute-retention %s: a mention that late would land in an expired minute bucket", c.MaxLateness, c.MinuteRetention)
		case hours && c.MaxLateness > c.HourRetention:
			p.bad("max-lateness", "%s is longer than hour-retention %s: a mention that late would land in an expired hour bucket", c.MaxLateness, c.HourRetention)
		}
	}
}

// checkCache checks the lookup API's cache of gathered totals.
func (c *Config) checkCache(p *problems) {
	p.durIn("cache-ttl", c.CacheTTL, time.Millisecond, time.Hour)
	if c.CacheStale != 0 && c.CacheStale < c.CacheTTL {
		p.bad("cache-stale", "%s is shorter than cache-ttl %s (0 means 10 × cache-ttl)", c.CacheStale, c.CacheTTL)
	}
	p.durIn("cache-stale", c.CacheStale, 0, 24*time.Hour)
	p.intIn("cache-size", int64(c.CacheSize), 1, 100_000_000)
}

// checkWindows checks the time buckets, their retention and the subject
// their flush summaries go out on, which must stay out of the subscription
// (prefix).
func (c *Config) checkWindows(p *problems, prefix string) {
	if c.Windows != "none" {
		for _, w := range strings.Split(c.Windows, ",") {
			if w := strings.TrimSpace(w); w != "1m" && w != "1h" {
				p.bad("windows", "%q is not a list of 1m and 1h, or none", c.Windows)
				break
			}
		}
	}
	p.durIn("minute-retention", c.MinuteRetention, time.Hour, 30*24*time.Hour)
	p.durIn("hour-retention", c.HourRetention, 24*time.Hour, 400*24*time.Hour)
	if c.TrendSubject == "" || strings.ContainsAny(c.TrendSubject, "*> \t") {
		p.bad("trend-subject", "%q is not a plain NATS subject", c.TrendSubject)
	} else if prefix != "" && strings.HasPrefix(c.TrendSubject, prefix) {
		p.bad("trend-subject", "%q is under the subscription %q: summaries would come back as mentions", c.TrendSubject, c.Subject)
	}
}

// checkListeners checks the lookup API's and the admin listener's
// addresses, and that the lookup API is not left open by accident.
func (c *Config) checkListeners(p *problems) {
	p.addr("http", c.HTTPAddr)
	if c.HTTPTokenFile == "" && !c.HTTPPublic && !loopback(c.HTTPAddr) {
		p.bad("http", "%s listens beyond this machine and --http-token-file is not set: set a token file, or --http-public to serve every count to anyone who can reach it", c.HTTPAddr)
	}
	p.addr("admin", c.AdminAddr)
	if overlap(c.HTTPAddr, c.AdminAddr) {
		p.bad("admin", "%s and --http %s would bind the same port: give them different ports", c.AdminAddr, c.HTTPAddr)
	}
	p.durIn("health-flush-age", c.HealthFlushAge, 0, 24*time.Hour)
}

// checkShutdown checks that the shutdown budget leaves room for the final
// flush after the NATS drain.
func (c *Config) checkShutdown(p *problems) {
	p.durIn("shutdown-timeout", c.ShutdownTimeout, time.Second, 10*time.Minute)
	if c.ShutdownTimeout-c.ShutdownReserve() <= c.DrainTimeout {
		p.bad("shutdown-timeout", "%s must be longer than drain-timeout %s plus the reserve kept after the final flush (%s), to leave time for the final flush", c.ShutdownTimeout, c.DrainTimeout, c.ShutdownReserve())
	}
}

// checkMemory checks the memory budgets and the spill folder's bound.
func (c *Config) checkMemory(p *problems) {
	if _, err := ParseBytes(c.MemoryLimit); err != nil && c.MemoryLimit != "none" {
		p.bad("memory-limit", "%v", err)
	}
	if n, err := ParseBytes(c.BufferMemory); err != nil && c.BufferMemory != "none" {
		p.bad("buffer-memory", "%v", err)
	} else if c.BufferMemory != "" && c.BufferMemory != "none" && n < 1<<20 {
		p.bad("buffer-memory", "%s is less than 1Mi", c.BufferMemory)
	}
	if _, err := ParseBytes(c.SpillMaxBytes); err != nil {
		p.bad("spill-max-bytes", "%v", err)
	}
}

// checkLogging checks the log encoding and level.
func (c *Config) checkLogging(p *problems) {
	if c.LogFormat != "json" && c.LogFormat != "console" {
		p.bad("log-format", "%q is not json or console", c.LogFormat)
	}
	if _, err := zapcore.ParseLevel(c.LogLevel); err != nil {
		p.bad("log-level", "%q is not debug, info, warn or error", c.LogLevel)
	}
}

// ReadGuess is the shard count a lookup reads in its first round trip; the
// topic's metadata, read in the same round trip, brings the rest.
func (c *Config) ReadGuess() int { return c.Shards }

// CacheStaleAge is the age up to which a stale total is served.
func (c *Config) CacheStaleAge() time.Duration {
	if c.CacheStale > 0 {
		return c.CacheStale
	}
	return lookup.DefaultStaleFactor * c.CacheTTL
}

// HealthAge is the age of the last good flush past which /healthz fails.
func (c *Config) HealthAge() time.Duration {
	if c.HealthFlushAge > 0 {
		return c.HealthFlushAge
	}
	return 5 * c.FlushInterval
}

// Print writes the effective settings of fs as YAML, the form --config
// reads, with secrets (the token, a password in a URL) redacted.
func Print(w io.Writer, fs *pflag.FlagSet) error {
	secret := make(map[string]bool)
	for _, s := range settings {
		secret[s.name] = s.secret
	}
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Name == "config" {
			return
		}
		v := f.Value.String()
		switch {
		case secret[f.Name] && v != "":
			v = ingest.Redacted
		case f.Name == "nats-url":
			v = ingest.RedactURLs(v)
		}
		_, err = fmt.Fprintf(w, "%s: %q\n", f.Name, v)
	})
	return err
}

// NATSAuth is the NATS authentication part of c.
func (c *Config) NATSAuth() ingest.Auth {
	return ingest.Auth{
		Creds: c.NATSCreds, NKey: c.NATSNKey, Token: c.NATSToken,
		TLSCA: c.NATSTLSCA, TLSCert: c.NATSTLSCert, TLSKey: c.NATSTLSKey,
	}
}

// loopbackHost says whether host names this machine's loopback interface
// (localhost resolves to 127.0.0.1 and ::1 alike, so it may share a port
// with either).
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopback says whether a listen address binds only this machine's
// loopback interface (an empty host binds every interface).
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ReadToken reads the lookup API's bearer token from path: the file's
// content without surrounding white space, at least 16 bytes.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 {
		return "", fmt.Errorf("token in %s is %d bytes; use at least 16 (say, openssl rand -hex 32)", path, len(tok))
	}
	return tok, nil
}

// StoreScope names the store's data, for sidecars sharing totals: the
// table, with its endpoint when one is set (DynamoDB), or the data folder
// (the embedded store).
func (c Config) StoreScope() string {
	if c.Store == StoreBolt {
		return "bolt:" + c.DataDir
	}
	return "dynamodb:" + c.DynamoDBEndpoint + "/" + c.Table
}

// SharesTotals says whether gathered totals are shared with the fleet:
// --share-totals, where auto is on in JetStream mode (a fleet that shares
// a stream shares its topics) and off in core mode.
func (c Config) SharesTotals() bool {
	return c.ShareTotals == "true" || c.ShareTotals == "auto" && c.Durable()
}

// BufferBudget is the window's memory budget in bytes, 0 for none, given
// the process's GOMEMLIMIT (math.MaxInt64 when unset). The default is an
// eighth of the limit: the window filling, the one being flushed or
// spilled, nats.go's pending messages and the garbage collector's headroom
// over them all fit in the rest.
func (c Config) BufferBudget(gomemlimit int64) int64 {
	switch c.BufferMemory {
	case "none":
		return 0
	case "":
		if gomemlimit <= 0 || gomemlimit >= 1<<62 {
			return 256 << 20
		}
		return gomemlimit / 8
	}
	n, _ := ParseBytes(c.BufferMemory)
	return n
}

// ShutdownReserve is the part of --shutdown-timeout kept for what follows
// the final flush (flushing publishes to NATS, closing it, the HTTP
// shutdown): a tenth, at most a second.
func (c Config) ShutdownReserve() time.Duration { return min(c.ShutdownTimeout/10, time.Second) }

// UsesDataDir says whether a sidecar with these settings keeps files in
// DataDir: the embedded store's, or core mode's spill folder and
// quarantine.
func (c Config) UsesDataDir() bool {
	return c.Store == StoreBolt || (c.NATSMode == ModeCore && (c.SpillBudget() > 0 || c.QuarantineAfter > 0))
}

// SpillBudget is the spill folder's byte budget; 0: no spill.
func (c Config) SpillBudget() int64 {
	n, _ := ParseBytes(c.SpillMaxBytes)
	return n
}

// ParseBytes reads a size: a whole number of bytes with an optional Ki, Mi
// or Gi suffix. Empty is 0.
func ParseBytes(v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	mult := int64(1)
	for suffix, m := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(v, suffix); ok {
			v, mult = n, m
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size (bytes, or a number with Ki, Mi or Gi)", v)
	}
	return n * mult, nil
}

// overlap says whether two listen addresses would bind the same port: the
// same port on the same host, on two loopback names, or on any host when
// one binds every interface (an empty host, 0.0.0.0 or ::). Port 0 picks a
// free port, so it never conflicts.
func overlap(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb || pa == "0" {
		return false
	}
	every := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || every(ha) || every(hb) || (loopbackHost(ha) && loopbackHost(hb))
}

// EnginePosition is the durable engine (--durable-engine).
const EnginePosition = "position"

// Durable says whether mentions come from JetStream streams, counted
// exactly once by stream position (jetstream and partitioned modes), as
// opposed to core NATS.
func (c Config) Durable() bool { return c.NATSMode == ModeJetStream || c.NATSMode == ModePartitioned }
