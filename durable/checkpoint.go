package durable

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/store"
)

// DefaultCheckpointBucket is the JetStream key-value bucket of the
// partitions' checkpoints.
const DefaultCheckpointBucket = "hotcount_checkpoints"

// checkpoints keeps, per partition stream, the sequence below which every
// mention is in the store: a reader that takes a partition over starts
// after it. It is a hint for speed, not the truth about what is counted
// (the items' positions are): one too low costs a re-read that the items'
// conditions refuse, and it only ever moves forward, so one claimed by a
// sidecar that froze and woke up cannot move it back.
type checkpoints struct {
	kv jetstream.KeyValue
}

// openCheckpoints opens (creating if absent) the bucket. Replicas is the
// bucket's replication in a cluster (1 outside one).
func openCheckpoints(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*checkpoints, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "hotcount: per partition stream, the sequence below which every mention is in the store",
		History:     1,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("durable: checkpoint bucket %s: %w", bucket, err)
	}
	return &checkpoints{kv: kv}, nil
}

// load returns stream's checkpoint: zero when it has none.
func (c *checkpoints) load(ctx context.Context, name string) (store.Position, uint64, error) {
	e, err := c.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return store.Position{}, 0, nil
	}
	if err != nil {
		return store.Position{}, 0, fmt.Errorf("durable: checkpoint of %s: %w", name, err)
	}
	p, err := parsePosition(string(e.Value()))
	if err != nil {
		return store.Position{}, 0, fmt.Errorf("durable: checkpoint of %s: %w", name, err)
	}
	return p, e.Revision(), nil
}

// advance moves stream's checkpoint to p if p is past it (a newer epoch,
// or a higher sequence in the same one). Two sidecars advancing at once
// are settled by the bucket's compare-and-set: the loser reads again.
func (c *checkpoints) advance(ctx context.Context, name string, p store.Position) error {
	for range 5 {
		cur, rev, err := c.load(ctx, name)
		if err != nil {
			return err
		}
		if !after(p, cur) {
			return nil
		}
		v := []byte(formatPosition(p))
		if rev == 0 {
			_, err = c.kv.Create(ctx, name, v)
		} else {
			_, err = c.kv.Update(ctx, name, v, rev)
		}
		if err == nil || !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return err
		}
	}
	return fmt.Errorf("durable: checkpoint of %s: changed under every try", name)
}

// isWrongSequence says whether err is a compare-and-set that lost.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// after says whether a is past b: a newer epoch, or the same and a higher
// sequence.
func after(a, b store.Position) bool {
	return a.Epoch > b.Epoch || a.Epoch == b.Epoch && a.Seq > b.Seq
}

func formatPosition(p store.Position) string {
	return strconv.FormatInt(p.Epoch, 10) + ":" + strconv.FormatUint(p.Seq, 10)
}

func parsePosition(s string) (store.Position, error) {
	e, q, ok := strings.Cut(s, ":")
	epoch, err1 := strconv.ParseInt(e, 10, 64)
	seq, err2 := strconv.ParseUint(q, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return store.Position{}, fmt.Errorf("%q is not <epoch>:<sequence>", s)
	}
	return store.Position{Epoch: epoch, Seq: seq}, nil
}

// Adopt gives stream a checkpoint at seq in its current epoch, unless it
// has one as far already: `hotcount stream adopt`, which hands a stream
// the journal engine read to the position engine at its consumer's
// acknowledgement floor. bucket is the checkpoints' bucket ("": the
// default), created on the stream's replicas if absent.
func Adopt(ctx context.Context, js jetstream.JetStream, stream, bucket string, seq uint64) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("durable: adopt %s: %w", stream, err)
	}
	info := st.CachedInfo()
	if bucket == "" {
		bucket = DefaultCheckpointBucket
	}
	c, err := openCheckpoints(ctx, js, bucket, info.Config.Replicas)
	if err != nil {
		return err
	}
	return c.advance(ctx, stream, store.Position{Epoch: epochOf(info), Seq: seq})
}
