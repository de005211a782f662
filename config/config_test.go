package config_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/config"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hotcount.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrecedence: flag over environment over file over default.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "shards: 8\nflush-interval: 3s\ntable: from-file\nhttp: 127.0.0.1:1111\n")
	cfg := config.Default()
	fs := cfg.FlagSet("run", nil)
	err := config.Parse(fs,
		[]string{"--config", file, "--shards", "16"},
		[]string{"HOTCOUNT_SHARDS=12", "HOTCOUNT_FLUSH_INTERVAL=2s", "HOTCOUNT_HTTP=127.0.0.1:2222", "PATH=/bin"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Shards != 16 {
		t.Errorf("shards = %d, want 16 (flag)", cfg.Shards)
	}
	if cfg.FlushInterval != 2*time.Second {
		t.Errorf("flush-interval = %s, want 2s (env over file)", cfg.FlushInterval)
	}
	if cfg.HTTPAddr != "127.0.0.1:2222" {
		t.Errorf("http = %s, want 127.0.0.1:2222 (HOTCOUNT_HTTP)", cfg.HTTPAddr)
	}
	if cfg.Table != "from-file" {
		t.Errorf("table = %s, want from-file", cfg.Table)
	}
	if cfg.CacheTTL != time.Second {
		t.Errorf("cache-ttl = %s, want the 1s default", cfg.CacheTTL)
	}
	if err := cfg.Validate(); err != nil {
		t.Error(err)
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	file := writeFile(t, "table: via-env-file\n")
	cfg := config.Default()
	if err := config.Parse(cfg.FlagSet("run", nil), nil, []string{"HOTCOUNT_CONFIG=" + file}); err != nil {
		t.Fatal(err)
	}
	if cfg.Table != "via-env-file" {
		t.Errorf("table = %s, want via-env-file", cfg.Table)
	}
}

func TestStrictness(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		args    []string
		env     []string
		wantErr string
	}{
		{"unknown file key", "shard: 4\n", nil, nil, `unknown setting "shard"`},
		{"nested file key", "nats:\n  url: x\n", nil, nil, `unknown setting "nats.url"`},
		{"file type", "shards: many\n", nil, nil, `shards`},
		{"unknown env", "", nil, []string{"HOTCOUNT_SHARD=4"}, "HOTCOUNT_SHARD (did you mean HOTCOUNT_SHARDS?)"},
		{"env type names the variable", "", nil, []string{"HOTCOUNT_SHARDS=abc"}, `$HOTCOUNT_SHARDS: "abc" is not a whole number (--shards)`},
		{"file type names the file", "shards: abc\n", nil, nil, `: shards: "abc" is not a whole number (--shards)`},
		{"env type", "", nil, []string{"HOTCOUNT_FLUSH_INTERVAL=soon"}, "flush-interval"},
		{"unknown flag", "", []string{"--shard", "4"}, nil, "shard"},
		{"missing file", "", []string{"--config", "/nonexistent/x.yaml"}, nil, "/nonexistent/x.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.file != "" {
				args = append(args, "--config", writeFile(t, tt.file))
			}
			cfg := config.Default()
			fs := cfg.FlagSet("run", nil)
			fs.SetOutput(&bytes.Buffer{})
			err := config.Parse(fs, args, tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse = %v, want an error naming %q", err, tt.wantErr)
			}
		})
	}
}

// TestValidate: each bad value is reported with the setting's name and what
// it allows.
func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*config.Config)
		wantErr string
	}{
		{"shards zero", func(c *config.Config) { c.Shards = 0 }, "shards: 0 is outside 1..100"},
		{"shards too many", func(c *config.Config) { c.Shards = 101 }, "shards: 101 is outside 1..100"},
		{"subject", func(c *config.Config) { c.Subject = "mentions.*" }, "subject:"},
		{"dead letter loop", func(c *config.Config) { c.DeadLetterSubject = "mentions.dlq" }, "dead-letter-subject:"},
		{"shared totals loop", func(c *config.Config) { c.ShareTotals, c.ShareSubject = "true", "mentions.totals" }, "share-subject:"},
		{"shared totals wildcard", func(c *config.Config) { c.ShareTotals, c.ShareSubject = "true", "totals.>" }, "share-subject:"},
		{"share totals word", func(c *config.Config) { c.ShareTotals = "yes" }, "share-totals:"},
		{"buffer memory tiny", func(c *config.Config) { c.BufferMemory = "1Ki" }, "buffer-memory:"},
		{"spill size", func(c *config.Config) { c.SpillMaxBytes = "lots" }, "spill-max-bytes:"},
		{"store", func(c *config.Config) { c.Store = "redis" }, `store: "redis" is not dynamodb or bolt`},
		{"table", func(c *config.Config) { c.Table = "x" }, "table:"},
		{"flush interval", func(c *config.Config) { c.FlushInterval = time.Millisecond }, "flush-interval: 1ms is outside 10ms..1h0m0s"},
		{"cache ttl", func(c *config.Config) { c.CacheTTL = 0 }, "cache-ttl:"},
		{"http addr", func(c *config.Config) { c.HTTPAddr = "8080" }, "http:"},
		{"same port", func(c *config.Config) { c.HTTPAddr, c.AdminAddr = ":9091", ":9091" }, "admin: :9091 and --http :9091 would bind the same port"},
		{"same port, one on every interface", func(c *config.Config) { c.HTTPAddr, c.AdminAddr = "127.0.0.1:9091", ":9091" }, "would bind the same port"},
		{"shutdown budget", func(c *config.Config) { c.ShutdownTimeout = 3 * time.Second }, "shutdown-timeout: 3s must be longer than drain-timeout"},
		{"log level", func(c *config.Config) { c.LogLevel = "loud" }, "log-level:"},
		{"queue group", func(c *config.Config) { c.QueueGroup = "" }, "queue-group:"},
		{"memory limit", func(c *config.Config) { c.MemoryLimit = "12X" }, `memory-limit: "12X" is not a size`},
		{"public lookup without a token", func(c *config.Config) { c.HTTPAddr = ":8080" }, "http: :8080 listens beyond this machine and --http-token-file is not set"},
		{"public lookup on an address without a token", func(c *config.Config) { c.HTTPAddr = "10.1.2.3:8080" }, "--http-public"},
		{"lateness negative", func(c *config.Config) { c.MaxLateness = -time.Second }, "max-lateness: -1s is outside 0s..9600h0m0s"},
		{"lateness past the minutes", func(c *config.Config) { c.Windows, c.MaxLateness = "1m,1h", 49*time.Hour }, "max-lateness: 49h0m0s is longer than minute-retention 48h0m0s"},
		{"trending bucket", func(c *config.Config) { c.TrendingBucket = "hotcount.trending" }, `trending-bucket: "hotcount.trending" is not a key-value bucket name`},
		{"review without minutes", func(c *config.Config) { c.TrendingReview = true }, "trending-review: there is no trending list to review without minute buckets (--windows none)"},
		{"lateness past the hours", func(c *config.Config) { c.Windows, c.MaxLateness = "1h", 900*time.Hour }, "max-lateness: 900h0m0s is longer than hour-retention 840h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			tt.mutate(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate = %v, want %q", err, tt.wantErr)
			}
		})
	}
	for _, c := range []config.Config{config.Default(), config.Dev()} {
		if err := c.Validate(); err != nil {
			t.Errorf("defaults do not validate: %v", err)
		}
	}
	// Beyond loopback with a token, or said to be public, is fine.
	for _, mutate := range []func(*config.Config){
		func(c *config.Config) { c.HTTPAddr, c.HTTPTokenFile = ":8080", "/run/token" },
		func(c *config.Config) { c.HTTPAddr, c.HTTPPublic = "0.0.0.0:8080", true },
		func(c *config.Config) { c.HTTPAddr = "localhost:8080" },
		func(c *config.Config) { c.HTTPAddr = "[::1]:8080" },
	} {
		c := config.Default()
		mutate(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s (token %q, public %v): %v", c.HTTPAddr, c.HTTPTokenFile, c.HTTPPublic, err)
		}
	}
}

// TestLateness: --max-lateness, or by default a day, within the minute
// buckets' retention when they are on.
func TestLateness(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*config.Config)
		want   time.Duration
	}{
		{"default", func(*config.Config) {}, 24 * time.Hour},
		{"minutes kept longer", func(c *config.Config) { c.Windows, c.MinuteRetention = "1m", 72*time.Hour }, 24 * time.Hour},
		{"minutes kept shorter", func(c *config.Config) { c.Windows, c.MinuteRetention = "1m,1h", 6*time.Hour }, 6 * time.Hour},
		{"only hours", func(c *config.Config) { c.Windows, c.MinuteRetention = "1h", 6*time.Hour }, 24 * time.Hour},
		{"set", func(c *config.Config) { c.Windows, c.MaxLateness = "1m,1h", 2*time.Hour }, 2 * time.Hour},
		{"set, no buckets", func(c *config.Config) { c.MaxLateness = 72 * time.Hour }, 72 * time.Hour},
	}
	for _, tt := range tests {
		cfg := config.Default()
		tt.mutate(&cfg)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
		if got := cfg.Lateness(); got != tt.want {
			t.Errorf("%s: Lateness() = %s, want %s", tt.name, got, tt.want)
		}
	}
	cfg := config.Default()
	if err := config.Parse(cfg.FlagSet("run", nil), nil, []string{"HOTCOUNT_MAX_LATENESS=90m"}); err != nil || cfg.MaxLateness != 90*time.Minute {
		t.Errorf("HOTCOUNT_MAX_LATENESS=90m: %s, %v", cfg.MaxLateness, err)
	}
}

// TestPrintRoundTrips: check-config's output is a config file that gives
// the same settings back.
func TestPrintRoundTrips(t *testing.T) {
	cfg := config.Default()
	fs := cfg.FlagSet("run", nil)
	if err := config.Parse(fs, []string{"--shards", "7", "--dynamodb-endpoint", "http://127.0.0.1:8000"}, nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := config.Print(&out, fs); err != nil {
		t.Fatal(err)
	}
	again := config.Default()
	if err := config.Parse(again.FlagSet("run", nil), []string{"--config", writeFile(t, out.String())}, nil); err != nil {
		t.Fatalf("printed config does not parse: %v\n%s", err, out.String())
	}
	again.File = ""
	if again != cfg {
		t.Errorf("round trip: %+v, want %+v", again, cfg)
	}
}

// TestSecretsAreRedacted: check-config's output never shows the token or a
// password in the NATS URL.
func TestSecretsAreRedacted(t *testing.T) {
	cfg := config.Default()
	fs := cfg.FlagSet("run", nil)
	err := config.Parse(fs, []string{"--nats-url", "nats://alice:s3cret@nats-1:4222,nats://t0ken@nats-2:4222"},
		[]string{"HOTCOUNT_NATS_TOKEN=tok-123"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := config.Print(&out, fs); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"s3cret", "t0ken", "tok-123"} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("printed settings show %q:\n%s", secret, out.String())
		}
	}
	if !strings.Contains(out.String(), `nats-token: "REDACTED"`) || !strings.Contains(out.String(), "alice:REDACTED@nats-1") {
		t.Errorf("redaction markers missing:\n%s", out.String())
	}
}

// TestDeprecatedVariables: the variables' former names still work, with a
// warning naming the new one; the new name wins when both are set.
func TestDeprecatedVariables(t *testing.T) {
	cfg := config.Default()
	old := []string{"HOTCOUNT_HTTP_ADDR=127.0.0.1:2222", "HOTCOUNT_ADMIN_ADDR=127.0.0.1:3333"}
	if err := config.Parse(cfg.FlagSet("run", nil), nil, old); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTPAddr != "127.0.0.1:2222" || cfg.AdminAddr != "127.0.0.1:3333" {
		t.Errorf("http, admin = %s, %s; want the former variables' 127.0.0.1:2222, 127.0.0.1:3333", cfg.HTTPAddr, cfg.AdminAddr)
	}
	warnings := config.Deprecated(old)
	if len(warnings) != 2 || !strings.Contains(warnings[0], "rename it HOTCOUNT_HTTP") || !strings.Contains(warnings[1], "rename it HOTCOUNT_ADMIN") {
		t.Errorf("Deprecated = %q, want one warning per former name naming the new one", warnings)
	}
	if w := config.Deprecated([]string{"HOTCOUNT_HTTP=x", "HOTCOUNT_SHARDS=2"}); len(w) != 0 {
		t.Errorf("Deprecated(current names) = %q, want none", w)
	}

	both := config.Default()
	if err := config.Parse(both.FlagSet("run", nil), nil, []string{"HOTCOUNT_HTTP_ADDR=127.0.0.1:2222", "HOTCOUNT_HTTP=127.0.0.1:4444"}); err != nil {
		t.Fatal(err)
	}
	if both.HTTPAddr != "127.0.0.1:4444" {
		t.Errorf("http = %s with both names set, want the current name's 127.0.0.1:4444", both.HTTPAddr)
	}
}

// TestOneFileForEveryCommand: a --config file may hold settings a command
// does not take (run's --http, read by load): they are left to the
// commands that take them, as variables are; a key no command knows is
// still an error.
func TestOneFileForEveryCommand(t *testing.T) {
	file := writeFile(t, "http: 127.0.0.1:8181\nnats-url: nats://10.0.0.1:4222\n")
	cfg := config.Default()
	fs := cfg.FlagSet("load", func(s string) bool { return s == "nats-url" || s == "config" })
	if err := config.Parse(fs, []string{"--config", file}, nil); err != nil {
		t.Fatalf("a run setting in the file refused by load: %v", err)
	}
	if cfg.NATSURL != "nats://10.0.0.1:4222" {
		t.Errorf("nats-url = %s, want the file's", cfg.NATSURL)
	}
	bad := writeFile(t, "htttp: 127.0.0.1:8181\n")
	if err := config.Parse(cfg.FlagSet("load", func(s string) bool { return s == "config" }), []string{"--config", bad}, nil); err == nil || !strings.Contains(err.Error(), `unknown setting "htttp"`) {
		t.Errorf("an unknown key = %v, want refused", err)
	}
}

// TestExplainNamesTheSource: a complaint about a value from the file or the
// environment says where it came from; one about the command line's does
// not, even when the file or the environment set that setting too.
func TestExplainNamesTheSource(t *testing.T) {
	file := writeFile(t, "shards: 0\ncache-size: 0\nmax-topics: 0\n")
	cfg := config.Default()
	fs := cfg.FlagSet("run", nil)
	if err := config.Parse(fs, []string{"--config", file, "--max-topics", "0"}, []string{"HOTCOUNT_CACHE_SIZE=0", "HOTCOUNT_MAX_TOPIC_BYTES=0"}); err != nil {
		t.Fatal(err)
	}
	got := config.Explain(cfg.Validate(), fs).Error()
	for _, want := range []string{
		"shards: 0 is outside 1..100 (from the --config file)",
		"cache-size: 0 is outside 1..100000000 (from $HOTCOUNT_CACHE_SIZE)",
		"max-topic-bytes: 0 is outside 1..1024 (from $HOTCOUNT_MAX_TOPIC_BYTES)",
		"max-topics: 0 is outside 1..100000000\n",
	} {
		if !strings.Contains(got+"\n", want) {
			t.Errorf("Explain lacks %q:\n%s", want, got)
		}
	}
}
