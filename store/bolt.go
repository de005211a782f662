package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// boltBucket holds every shard item, keyed by ShardKey.
var boltBucket = []byte("shards")

// Bolt is the embedded store: the same key schema and the same atomic-add and
// gather semantics as DynamoDB, in one bbolt file, so that `hotcount dev`
// needs no outside service and keeps its counts across restarts. It is safe
// for concurrent use. Concurrent Adds are coalesced into one transaction (and
// one fsync) by bbolt's Batch.
type Bolt struct {
	db      *bolt.DB
	metrics *Metrics
}

// OpenBolt opens (creating if needed) the store in dir/hotcount.db. Only one
// process may hold it open: a second one waits up to a second, then fails.
func OpenBolt(dir string, m *Metrics) (*Bolt, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("store: create data dir: %w", err)
	}
	path := filepath.Join(dir, "hotcount.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: init %s: %w", path, err)
	}
	// Batch runs a transaction when it has MaxBatchSize calls or after
	// MaxBatchDelay. The flusher keeps only --flush-concurrency writes in
	// flight, so the default size (1000) is never reached and every batch
	// would wait the default 10 ms; 1 ms keeps a flush of thousands of
	// topics fast while still putting each fsync behind many writes.
	db.MaxBatchDelay = time.Millisecond
	return &Bolt{db: db, metrics: m}, nil
}

// An item is two big-endian int64s: count, then updatedAt (Unix ms).
const boltItemLen = 16

func decodeItem(v []byte) (count, updatedAt int64, err error) {
	if v == nil {
		return 0, 0, nil
	}
	if len(v) != boltItemLen {
		return 0, 0, fmt.Errorf("store: corrupt item of %d bytes", len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:])), nil
}

// Add increments one shard of topic by delta, atomically. An increment that
// would overflow int64 fails with ErrOverflow and changes nothing.
func (b *Bolt) Add(ctx context.Context, topic string, shard int, delta int64, now time.Time) error {
	b.metrics.writes.Inc()
	key := []byte(ShardKey(topic, shard))
	err := b.db.Batch(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		count, _, err := decodeItem(bk.Get(key))
		if err != nil {
			return err
		}
		if (delta > 0 && count > math.MaxInt64-delta) || (delta < 0 && count < math.MinInt64-delta) {
			return ErrOverflow
		}
		var v [boltItemLen]byte
		binary.BigEndian.PutUint64(v[:], uint64(count+delta))
		binary.BigEndian.PutUint64(v[8:], uint64(UnixMilli(now)))
		return bk.Put(key, v[:])
	})
	if err != nil {
		err = fmt.Errorf("store: update %s: %w", key, err)
		b.metrics.failed("write", err)
		return err
	}
	return nil
}

// Gather reads shards 0..n-1 of topic in one read transaction, which (unlike
// DynamoDB) is a consistent snapshot; consistent is accepted for the shared
// interface and changes nothing.
func (b *Bolt) Gather(ctx context.Context, topic string, n int, consistent bool) ([]Shard, error) {
	m, err := b.GatherMany(ctx, []string{topic}, n, consistent)
	if err != nil {
		return nil, err
	}
	return m[topic], nil
}

// GatherMany is Gather for several topics, in one read transaction. Like
// DynamoDB's, it reads at least n shards and all that the metadata says.
func (b *Bolt) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]Shard, error) {
	b.metrics.gathers.Add(float64(len(topics)))
	out := make(map[string][]Shard, len(topics))
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		for _, topic := range topics {
			m, err := boltMeta(bk, topic)
			if err != nil {
				return err
			}
			shards := make([]Shard, max(n, m.Read()))
			b.metrics.reads.Add(float64(len(shards) + 1))
			for i := range shards {
				shards[i].Shard = i
				shards[i].Count, shards[i].UpdatedAt, err = decodeItem(bk.Get([]byte(ShardKey(topic, i))))
				if err != nil {
					return err
				}
			}
			out[topic] = shards
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("store: gather %q: %w", topics, err)
		b.metrics.failed("read", err)
		return nil, err
	}
	return out, nil
}

// boltMeta reads topic's metadata: two big-endian int64s, shards and
// readShards, under MetaKey.
func boltMeta(bk *bolt.Bucket, topic string) (Meta, error) {
	s, r, err := decodeItem(bk.Get([]byte(MetaKey(topic))))
	if err != nil || s == 0 {
		return Meta{}, err
	}
	return Meta{Shards: int(s), ReadShards: int(r)}, nil
}

// Metas reads the metadata of topics (zero Meta for those without).
func (b *Bolt) Metas(ctx context.Context, topics []string) (map[string]Meta, error) {
	out := make(map[string]Meta, len(topics))
	err := b.db.View(func(tx *bolt.Tx) error {
		for _, t := range topics {
			m, err := boltMeta(tx.Bucket(boltBucket), t)
			if err != nil {
				return err
			}
			if m.Exists() {
				out[t] = m
			}
		}
		return nil
	})
	return out, err
}

// SetMeta changes topic's metadata from old to m if it is still old, in one
// transaction; else ErrConflict.
func (b *Bolt) SetMeta(ctx context.Context, topic string, old, m Meta) error {
	b.metrics.metaWrites.Inc()
	// Batch, as for counts: a first flush records many new topics at once,
	// and one fsync per topic would stall it. The function is safe to run
	// again (it re-reads what it checks), as Batch may.
	return b.db.Batch(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		cur, err := boltMeta(bk, topic)
		if err != nil {
			return err
		}
		if cur != old {
			return fmt.Errorf("store: set shards of %q: %w", topic, ErrConflict)
		}
		var v [boltItemLen]byte
		binary.BigEndian.PutUint64(v[:], uint64(m.Shards))
		binary.BigEndian.PutUint64(v[8:], uint64(m.ReadShards))
		return bk.Put([]byte(MetaKey(topic)), v[:])
	})
}

// Ping checks that the database is open.
func (b *Bolt) Ping(ctx context.Context) error {
	return b.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(boltBucket) == nil {
			return fmt.Errorf("store: bucket %s missing", boltBucket)
		}
		return nil
	})
}

// Close releases the file. Calls after Close fail.
func (b *Bolt) Close() error { return b.db.Close() }
