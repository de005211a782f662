package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hotcount/hotcount/internal/natsauth"
	"github.com/hotcount/hotcount/mention"
)

// What the settings mean to the stages: the values derived from them, for
// the settings whose zero or empty value stands for a default.

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
// or when it is 0, mention.DefaultMaxLateness (24h), lowered to
// --minute-retention when minute buckets are on and kept for less.
func (c Config) Lateness() time.Duration {
	if c.MaxLateness > 0 {
		return c.MaxLateness
	}
	if minutes, _ := c.Buckets(); minutes && c.MinuteRetention > 0 && c.MinuteRetention < mention.DefaultMaxLateness {
		return c.MinuteRetention
	}
	return mention.DefaultMaxLateness
}

// FlushWrites is the most writes a flush keeps in flight: --flush-concurrency,
// or when it is 0, the default for the store.
func (c Config) FlushWrites() int {
	switch {
	case c.FlushConcurrency > 0:
		return c.FlushConcurrency
	case c.Store == StoreBolt:
		return EmbeddedFlushConcurrency
	default:
		return DefaultFlushConcurrency
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

// ReadGuess is the shard count a lookup reads in its first round trip; the
// topic's metadata, read in the same round trip, brings the rest.
func (c *Config) ReadGuess() int { return c.Shards }

// CacheStaleAge is the age up to which a stale total is served.
func (c *Config) CacheStaleAge() time.Duration {
	if c.CacheStale > 0 {
		return c.CacheStale
	}
	return DefaultStaleFactor * c.CacheTTL
}

// HealthAge is the age of the last good flush past which /healthz fails.
func (c *Config) HealthAge() time.Duration {
	if c.HealthFlushAge > 0 {
		return c.HealthFlushAge
	}
	return 5 * c.FlushInterval
}

// NATSAuth is the NATS authentication part of c.
func (c *Config) NATSAuth() natsauth.Auth {
	return natsauth.Auth{
		Creds: c.NATSCreds, NKey: c.NATSNKey, Token: c.NATSToken,
		TLSCA: c.NATSTLSCA, TLSCert: c.NATSTLSCert, TLSKey: c.NATSTLSKey,
	}
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

// Durable says whether mentions come from JetStream streams, counted
// exactly once by stream position (jetstream and partitioned modes), as
// opposed to core NATS.
func (c Config) Durable() bool { return c.NATSMode == ModeJetStream || c.NATSMode == ModePartitioned }
