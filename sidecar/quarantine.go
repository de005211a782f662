package sidecar

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/journal"
	"github.com/hotcount/hotcount/durability/quarantine"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/waits"
	"github.com/hotcount/hotcount/pipeline/store"
)

// OpenQuarantine opens the quarantine cfg's mode keeps: in the durable
// modes the JetStream key-value bucket the previous release's journal
// engine kept (its writes are listed and replayed; the durable engine
// holds its own in the streams' checkpoint records), on as many replicas
// as the mentions' stream; in core mode the folder quarantine in
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
	return quarantine.OpenKV(ctx, js, quarantine.DefaultBucket, mentionsReplicas(ctx, cfg, js))
}

// mentionsReplicas is the replication of the mentions' stream (in
// partitioned mode, of its first partition stream), which the buckets
// hotcount creates beside it take: 1 when there is none (core mode).
func mentionsReplicas(ctx context.Context, cfg config.Config, js jetstream.JetStream) int {
	stream := cfg.Stream
	if cfg.NATSMode == config.ModePartitioned {
		stream = streams.Layout{Stream: cfg.Stream, Partitions: cfg.Partitions}.Name(0)
	}
	if s, err := js.Stream(ctx, stream); err == nil {
		return s.CachedInfo().Config.Replicas
	}
	return 1
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

// openJournal opens the JetStream journal, retrying until NATS answers or
// ctx ends.
// A replay of a dead writer's entry releases the writes it marks as the
// quarantine's in quarantined() (nil: quarantine off, and there are none
// to meet but those an earlier run with it on left, which the replay then
// refuses).
func openJournal(ctx context.Context, nc *nats.Conn, cfg config.Config, writer string, st Store, quarantined func() quarantine.Store, log *zap.Logger, reg prometheus.Registerer) (*journal.Journal, error) {
	m := journal.NewMetrics(reg)
	jcfg := journal.Config{Bucket: journal.DefaultBucket, WritersBucket: journal.DefaultWritersBucket, Stream: cfg.Stream, Consumer: cfg.Consumer}
	jcfg.Release = func(ctx context.Context, writer string, seq int64) error {
		q := quarantined()
		if q == nil {
			return errors.New("sidecar: a journaled write is quarantined, and --quarantine-after 0 leaves this sidecar no quarantine to release it in")
		}
		return quarantine.Release(ctx, q, quarantine.Entry{Writer: writer, Seq: seq}.Key())
	}
	jcfg.QuarantineAfter = cfg.QuarantineAfter
	if d, ok := st.(*store.DynamoDB); ok {
		jcfg.Region = d.Regions.Own // its entries say which items they wrote
	}
	jcfg.Hold = func(ctx context.Context, e quarantine.Entry) error {
		q := quarantined()
		if q == nil {
			return errors.New("sidecar: no quarantine (--quarantine-after 0)")
		}
		return q.Put(ctx, e)
	}
	if cfg.NATSMode == config.ModePartitioned {
		jcfg.Partitions, jcfg.Bucket = cfg.Partitions, journal.PartitionsBucket
	}
	b := waits.Reconnect()
	jr, err := backoff.Retry(ctx, func() (*journal.Journal, error) {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		jr, err := journal.Open(octx, nc, jcfg, writer, st, log, m)
		if err != nil && ctx.Err() == nil {
			log.Warn("cannot open the journal; retrying", zap.Error(err))
		}
		return jr, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
	if err != nil {
		return nil, fmt.Errorf("sidecar: open the journal: %w", err)
	}
	return jr, nil
}
