package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/datadir"
	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/sidecar"
	"github.com/hotcount/hotcount/tools/console"
)

// defaultNATSPort is the embedded NATS server's port in dev mode: NATS's own.
const defaultNATSPort = 4222

// ensureStream creates the stream, or in partitioned mode the partition
// streams, on the embedded server, with `stream create`'s defaults.
func ensureStream(ctx context.Context, cfg config.Config) error {
	nc, err := connect(cfg, "hotcount-dev")
	if err != nil {
		return err
	}
	defer nc.Close()
	if cfg.NATSMode != config.ModePartitioned {
		_, err = ingest.EnsureStream(ctx, nc, cfg.Stream, cfg.Subject, mention.DefaultDuplicateWindow)
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = streams.Ensure(ctx, js, layoutOf(cfg), streams.Options{MaxAge: ingest.DefaultStreamMaxAge, MaxBytes: ingest.DefaultStreamMaxBytes, Duplicates: mention.DefaultDuplicateWindow})
	return err
}

// devMappings are the embedded server's subject mappings: partitioned
// mode's routing into the partition streams, as deploy/nats configures a
// real server.
func devMappings(cfg config.Config) map[string]string {
	if cfg.NATSMode != config.ModePartitioned {
		return nil
	}
	from, to := layoutOf(cfg).Mapping()
	return map[string]string{from: to}
}

// cmdDev runs an in-process NATS server (JetStream on, stored under
// --data-dir) and the sidecar on the embedded store, all on localhost. Each
// conflict with another process fails at once and says so: the data
// directory first (before anything opens a file in it), then the NATS
// port, then the HTTP ports (before the banner says where to publish).
func cmdDev(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Dev()
	fs := cfg.FlagSet("hotcount dev", func(s string) bool { return s != "nats-url" })
	port := fs.Int("nats-port", defaultNATSPort, "port of the embedded NATS server, on 127.0.0.1")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	if *port < 1 || *port > 65535 {
		return usageError{fmt.Errorf("--nats-port %d is not a port (1..65535)", *port)}
	}
	unlock, err := datadir.Lock(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	ns, err := embeddednats.Start(*port, filepath.Join(cfg.DataDir, "jetstream"), devMappings(cfg))
	if err != nil {
		return err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	cfg.NATSURL = ns.ClientURL()
	if cfg.Durable() {
		if err := ensureStream(ctx, cfg); err != nil {
			return err
		}
	}

	prefix := cfg.Subject[:len(cfg.Subject)-1] // "mentions.>" -> "mentions."
	return runSidecar(ctx, cfg, stderr, func(sc *sidecar.Sidecar) {
		fmt.Fprintf(stdout, `hotcount dev: NATS at %s (%s mode), counts in %s (store %s)
  publish:  nats --server %s pub %sgolang ''            (+1)
            nats --server %s pub %sgolang '{"count":5}' (+5)
            go run ./cmd/hotcount load --nats-url %s --duration 5s
  query:    curl http://%s/v1/topics/golang
            curl http://%s/v1/topics/golang/shards
  metrics:  curl http://%s/metrics
  console:  http://%s%s  (live totals, shards, charts and the race)
Ctrl-C stops it; counts stay in %s.
`, cfg.NATSURL, cfg.NATSMode, cfg.DataDir, cfg.Store, cfg.NATSURL, prefix, cfg.NATSURL, prefix, cfg.NATSURL,
			sc.HTTPAddr(), sc.HTTPAddr(), sc.AdminAddr(), sc.AdminAddr(), console.Path, cfg.DataDir)
	})
}
