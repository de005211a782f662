package sidecar

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/quarantine"
	"github.com/hotcount/hotcount/store"
	"github.com/hotcount/hotcount/streams"
)

// OpenQuarantine opens the quarantine cfg's mode keeps: in the durable
// modes a JetStream key-value bucket beside the journal, on as many
// replicas as the mentions' stream (all sidecars and `hotcount
// quarantine` share it); in core mode the folder quarantine in
// --data-dir, this sidecar's own. nc may be nil in core mode.
func OpenQuarantine(ctx context.Context, cfg config.Config, nc *nats.Conn) (quarantine.Store, error) {
	if !cfg.Durable() {
		return quarantine.OpenDir(filepath.Join(cfg.DataDir, "quarantine"))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("sidecar: quarantine: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream := cfg.Stream
	if cfg.NATSMode == config.ModePartitioned {
		stream = streams.Layout{Stream: cfg.Stream, Partitions: cfg.Partitions}.Name(0)
	}
	replicas := 1
	if s, err := js.Stream(ctx, stream); err == nil {
		replicas = s.CachedInfo().Config.Replicas
	}
	return quarantine.OpenKV(ctx, js, quarantine.DefaultBucket, replicas)
}

// QuarantineJournal is how `hotcount quarantine replay` reads the journal
// of cfg's mode (nil in core mode, which has none): see
// quarantine.Journal.
func QuarantineJournal(ctx context.Context, cfg config.Config, nc *nats.Conn) (quarantine.Journal, error) {
	if !cfg.Durable() {
		return nil, nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("sidecar: journal: %w", err)
	}
	bucket := journal.DefaultBucket
	if cfg.NATSMode == config.ModePartitioned {
		bucket = journal.PartitionsBucket
	}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		// No journal ever: no entry can be in it.
		return func(context.Context, string, string) (bool, bool, error) { return false, false, nil }, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sidecar: journal bucket %s: %w", bucket, err)
	}
	return func(ctx context.Context, key, counter string) (bool, bool, error) {
		return journal.Holds(ctx, kv, key, counter)
	}, nil
}

// SettleJournal settles, by the journal's own rules, the entries that
// stopped sidecars of --durable-engine journal left in it (`hotcount
// stream adopt`): a journal opened under a fresh writer id replays them,
// sending their writes again under their writers' identities, which the
// items' marks apply at most once, and marks them done. A sidecar that
// left the fleet (SIGTERM) is replayed at once; one that died, once its
// heartbeat lapses (journal.Lease).
func SettleJournal(ctx context.Context, cfg config.Config, nc *nats.Conn, st Store, log *zap.Logger) error {
	var q quarantine.Store
	if cfg.QuarantineAfter > 0 {
		var err error
		if q, err = OpenQuarantine(ctx, cfg, nc); err != nil {
			return err
		}
	}
	jr, err := openJournal(ctx, nc, cfg, store.NewWriterID(), st, func() quarantine.Store { return q }, log, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	defer jr.Leave(context.WithoutCancel(ctx)) //nolint:errcheck // its heartbeat lapses anyway
	return jr.Replay(ctx)
}
