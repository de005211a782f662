package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/ingest"
)

// natsSettings are the settings a command needs to reach NATS.
func natsSettings(s string) bool {
	switch s {
	case "nats-url", "nats-creds", "nats-nkey", "nats-token", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "subject", "config":
		return true
	}
	return false
}

// connect opens a plain NATS connection with cfg's authentication and the
// extra options.
func connect(cfg config.Config, name string, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := cfg.NATSAuth().Options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(cfg.NATSURL, append(append(opts, nats.Name(name)), extra...)...)
	if err != nil {
		return nil, ingest.RedactErr(fmt.Errorf("connect %s: %w", cfg.NATSURL, err), cfg.NATSURL)
	}
	return nc, nil
}

// cmdStreamCreate creates the stream of mentions if absent.
func cmdStreamCreate(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount stream create", func(s string) bool { return natsSettings(s) || s == "stream" })
	partitions := fs.Int("partitions", 0, "partition the stream by topic into this many partitions, for --nats-mode partitioned (the sidecars' --partitions); 0: not partitioned, for core and jetstream modes")
	replicas := fs.Int("replicas", 1, "the stream's replicas in a NATS cluster: 3 keeps every stored mention through the loss of a node")
	dup := fs.Duration("duplicate-window", ingest.DefaultDuplicateWindow, "window in which a repeated Nats-Msg-Id is dropped by the stream")
	maxAge := fs.Duration("max-age", ingest.DefaultStreamMaxAge, "how long the stream keeps a mention (counted or not)")
	maxBytes := fs.Int64("max-bytes", ingest.DefaultStreamMaxBytes, "the stream's storage bound in bytes; full, it refuses new publishes rather than drop stored mentions")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	nc, err := connect(cfg, "hotcount-stream-create")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if *maxAge <= 0 || *maxBytes <= 0 {
		return usageError{fmt.Errorf("--max-age and --max-bytes must be positive (got %s, %d)", *maxAge, *maxBytes)}
	}
	if *partitions < 0 || *partitions > 1024 || *replicas < 1 || *replicas > 5 {
		return usageError{fmt.Errorf("--partitions is 0..1024 and --replicas 1..5 (got %d, %d)", *partitions, *replicas)}
	}
	created, err := ingest.EnsureStream(ctx, nc, cfg.Stream, cfg.Subject, *dup, ingest.StreamOptions{MaxAge: *maxAge, MaxBytes: *maxBytes, Partitions: *partitions, Replicas: *replicas})
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stdout, "stream %s created (subjects %s, file storage, %d replica(s), duplicate window %s, max age %s, max bytes %d, new publishes refused when full)\n", cfg.Stream, cfg.Subject, *replicas, *dup, *maxAge, *maxBytes)
		if *partitions > 0 {
			fmt.Fprintf(stdout, "partitioned by topic into %d partitions: run the sidecars with --nats-mode partitioned --partitions %d\n", *partitions, *partitions)
		}
	} else {
		fmt.Fprintf(stdout, "stream %s exists; left as it is\n", cfg.Stream)
	}
	return nil
}
