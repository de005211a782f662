package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream defaults.
const (
	// DefaultStream is the stream of mentions.
	DefaultStream = "MENTIONS"
)

// Stream limits, `hotcount stream create`'s defaults.
const (
	// DefaultStreamMaxAge is how long the stream keeps a message: a day
	// for a fleet to come back from an outage before mentions age out.
	DefaultStreamMaxAge = 24 * time.Hour
	// DefaultStreamMaxBytes bounds the stream's storage (1 GiB). Full, it
	// refuses new publishes (producers see the error) rather than drop
	// stored mentions nobody has counted yet.
	DefaultStreamMaxBytes = 1 << 30
)

// StreamOptions shape the stream of mentions; zero fields take the
// defaults.
type StreamOptions struct {
	MaxAge   time.Duration
	MaxBytes int64
	// Replicas is the stream's replication factor in a NATS cluster
	// (default 1; 3 keeps it through the loss of a node).
	Replicas int
}

// ErrLegacyStream is EnsureStream's error for a stream of the name that is
// the previous release's partitioned stream (one stream, a partitioning
// transform), which jetstream mode cannot consume.
var ErrLegacyStream = errors.New("the previous release's partitioned stream")

// EnsureStream creates the stream of mentions (subjects: subject; file
// storage; a duplicate window for Nats-Msg-Id de-duplication; limits, by
// default DefaultStreamMaxAge and DefaultStreamMaxBytes, past which new
// publishes are refused) unless a stream of that name exists, which is then
// used as it is.
func EnsureStream(ctx context.Context, nc *nats.Conn, name, subject string, duplicates time.Duration, limits ...StreamOptions) (created bool, err error) {
	var lim StreamOptions
	if len(limits) > 0 {
		lim = limits[0]
	}
	if lim.MaxAge == 0 {
		lim.MaxAge = DefaultStreamMaxAge
	}
	if lim.MaxBytes == 0 {
		lim.MaxBytes = DefaultStreamMaxBytes
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return false, fmt.Errorf("ingest: jetstream: %w", err)
	}
	if s, err := js.Stream(ctx, name); err == nil {
		if tr := s.CachedInfo().Config.SubjectTransform; tr != nil {
			return false, fmt.Errorf("ingest: stream %s exists and is %w (%s): see deploy/README.md, \"Moving to partition streams\"", name, ErrLegacyStream, tr.Destination)
		}
		return false, nil
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, fmt.Errorf("ingest: look up stream %s: %w", name, err)
	}
	sc := jetstream.StreamConfig{
		Name:        name,
		Description: "mentions for hotcount",
		Subjects:    []string{subject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  duplicates,
		MaxAge:      lim.MaxAge,
		MaxBytes:    lim.MaxBytes,
		Discard:     jetstream.DiscardNew,
		Replicas:    max(lim.Replicas, 1),
	}
	_, err = js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return false, nil // another replica created it first
	}
	if err != nil {
		return false, fmt.Errorf("ingest: create stream %s: %w", name, err)
	}
	return true, nil
}
