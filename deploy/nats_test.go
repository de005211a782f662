package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/yaml"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestNATSConfigRoutesPartitions: the NATS server configuration shipped
// for partitioned mode (deploy/nats/hotcount.conf, and the NATS Helm
// chart's values rendered as the chart renders config.merge) routes
// producers' mentions into the partition streams of the default settings,
// as `hotcount stream create`'s probe checks it.
func TestNATSConfigRoutesPartitions(t *testing.T) {
	t.Run("hotcount.conf", func(t *testing.T) {
		// As its comment says to run it: nats-server -c hotcount.conf
		// -sd DIR -p PORT -m PORT, flags parsed as the binary parses them.
		fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
		opts, err := server.ConfigureOptions(fs, []string{"-c", "nats/hotcount.conf", "-sd", t.TempDir(), "-a", "127.0.0.1", "-p", "-1", "-m", "0"}, nil, nil, nil)
		if err != nil {
			t.Fatalf("nats-server -c nats/hotcount.conf -sd DIR: %v", err)
		}
		if !opts.JetStream {
			t.Fatal("the configuration leaves JetStream off")
		}
		probeWith(t, "nats/hotcount.conf", opts)
	})
	t.Run("helm-values.yaml", func(t *testing.T) {
		b, err := os.ReadFile("nats/helm-values.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Config struct {
				Merge map[string]any `json:"merge"`
			} `json:"config"`
		}
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		// The chart writes nats.conf as JSON with toPrettyRawJson: no
		// HTML escapes (a \u003e for the mapping's '>' would not parse).
		var conf bytes.Buffer
		enc := json.NewEncoder(&conf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v.Config.Merge); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "nats.conf")
		if err := os.WriteFile(path, conf.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		probeServer(t, path)
	})
}

// probeServer starts a NATS server with the configuration file at path
// (on a free port, storing in a temporary folder), creates the partition
// streams of the default settings and probes the routing.
func probeServer(t *testing.T, path string) {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("NATS refuses %s: %v", path, err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	probeWith(t, path, opts)
}

// probeWith starts a NATS server with opts (read from the file at path)
// and probes it as probeServer does.
func probeWith(t *testing.T, path string, opts *server.Options) {
	ns := testenv.NATSWith(t, opts)
	cfg := config.Default()
	l := streams.Layout{Stream: cfg.Stream, Subject: cfg.Subject, Partitions: config.DefaultPartitions}
	js, err := jetstream.New(testenv.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := streams.Ensure(ctx, js, l, streams.Options{MaxAge: time.Hour, MaxBytes: 64 << 20, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := streams.Probe(ctx, js, l); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
