package sidecar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/pipeline/moderation"
)

// moderationLoad bounds the first reading of the moderation at start: a
// NATS server that answers reads a bucket of hidden topics in
// milliseconds; one that does not must not hold the start up for long.
const moderationLoad = 5 * time.Second

// OpenModeration opens the fleet's moderation of the trending list
// (--trending-bucket) on nc, for `hotcount trending`: the bucket the
// sidecars made, never a new one that none of them would watch.
func OpenModeration(ctx context.Context, cfg config.Config, nc *nats.Conn) (*moderation.Bucket, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("sidecar: moderation: %w", err)
	}
	return moderation.Open(ctx, js, moderation.Config{Bucket: cfg.TrendingBucket, Existing: true})
}

// moderate screens the trending list with the fleet's moderation: a
// watcher of its bucket, read once before the listeners serve (so that a
// restarted sidecar never lists a hidden topic), then kept by a service.
//
// A NATS server without JetStream (core mode against a plain server)
// cannot keep it: the sidecar says so once and lists every topic, unless
// --trending-review asks for what cannot be honoured, and then it does
// not start. In the durable modes JetStream is there, or coming (a
// cluster still starting): the watcher waits for it.
func (s *Sidecar) moderate(ctx context.Context, p *parts) error {
	cfg := s.cfg
	js, err := jetstream.New(p.nc)
	if err != nil {
		return fmt.Errorf("sidecar: moderation: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, moderationLoad)
	defer cancel()
	mcfg := moderation.Config{Bucket: cfg.TrendingBucket, Replicas: mentionsReplicas(lctx, cfg, js)}
	w := moderation.NewWatcher(js, mcfg, cfg.TrendingReview, s.reg, s.log, s.clock)
	err = w.Load(lctx)
	switch {
	case err == nil:
	case errors.Is(err, moderation.ErrUnavailable) && !cfg.Durable():
		if cfg.TrendingReview {
			return fmt.Errorf("sidecar: --trending-review needs JetStream, where the topics allowed onto the list are kept, and %w", err)
		}
		s.log.Warn("trending moderation is off: the NATS server cannot keep it; /v1/trending lists every topic, and hotcount trending hide fails", zap.Error(err))
		return nil
	case cfg.TrendingReview:
		s.log.Warn("trending moderation not read yet: /v1/trending lists nothing (--trending-review) until it is", zap.String("bucket", cfg.TrendingBucket), zap.Error(err))
	default:
		s.log.Warn("trending moderation not read yet: /v1/trending lists hidden topics too until it is", zap.String("bucket", cfg.TrendingBucket), zap.Error(err))
	}
	p.services = append(p.services, w.Run)
	p.tr.UseModeration(w)
	return nil
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
