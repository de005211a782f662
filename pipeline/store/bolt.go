package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/hotcount/hotcount/schema"
)

// ErrLocked is OpenBolt's error when another process holds the store.
var ErrLocked = errors.New("store file locked by another process")

// BoltFile is the embedded store's file in its data directory.
const BoltFile = "hotcount.db"

// boltBucket holds every shard item, keyed by ShardKey.
var boltBucket = []byte("shards")

// Bolt is the embedded store: the same key schema and the same atomic-add and
// gather semantics as DynamoDB, in one bbolt file, so that `hotcount dev`
// needs no outside service and keeps its counts across restarts. It is safe
// for concurrent use. Concurrent writes are coalesced into one transaction
// (and one fsync) by a group committer.
type Bolt struct {
	db      *bolt.DB
	group   *groupCommitter
	metrics *Metrics
}

// OpenBolt opens (creating if needed) the store in dir/hotcount.db. Only one
// process may hold it open: a second one waits up to a second, then fails.
func OpenBolt(dir string, m *Metrics) (*Bolt, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("store: create data dir: %w", err)
	}
	path := filepath.Join(dir, BoltFile)
	// The free list is not written at each commit and is kept as a map, as
	// etcd runs bbolt: with millions of topics, writing it each commit and
	// searching it as an array cost more than the writes themselves. After
	// a crash bbolt rebuilds it by scanning the file on open.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("store: %s is locked by another process (a hotcount dev or run --store bolt on this --data-dir): stop it, or choose another --data-dir: %w", path, ErrLocked)
	}
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
	return &Bolt{db: db, group: newGroupCommitter(db), metrics: m}, nil
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

// A shard item may carry, after its count and updatedAt, the exactly-once
// bookkeeping that DynamoDB keeps in attributes: the floor (int64), then
// each writer's mark as a length-prefixed id and an int64 seq, then, after
// the byte boltPositions, each stream creation's position as a
// length-prefixed slot (stream.epoch), an int64 epoch and a uint64 seq. Items written before marks existed are
// 16 bytes and read as having none; items written before positions existed
// end with their marks and read as having none.
type boltShard struct {
	count, updatedAt, floor int64
	marks                   []mark
	positions               []streamPosition
}

// streamPosition is one stream creation's position on a bolt item: slot
// is its stream.epoch (position.go's slot).
type streamPosition struct {
	slot string
	Position
}

// boltPositions starts the positions, where a mark's length byte would be:
// no mark is that long (maxBoltWriter).
const boltPositions = 0xFF

// maxBoltWriter bounds a writer id in the embedded store: its length is a
// byte, and boltPositions is not a length.
const maxBoltWriter = boltPositions - 1

func decodeShard(v []byte) (boltShard, error) {
	var s boltShard
	var err error
	if s.count, s.updatedAt, err = decodeItem(v[:min(len(v), boltItemLen)]); err != nil || len(v) <= boltItemLen {
		return s, err
	}
	rest := v[boltItemLen:]
	if len(rest) < 8 {
		return s, fmt.Errorf("store: corrupt item of %d bytes", len(v))
	}
	s.floor = int64(binary.BigEndian.Uint64(rest))
	for rest = rest[8:]; len(rest) > 0; {
		if rest[0] == boltPositions {
			s.positions, err = decodePositions(rest[1:])
			if err != nil {
				return s, fmt.Errorf("store: corrupt item of %d bytes: %w", len(v), err)
			}
			return s, nil
		}
		n := int(rest[0])
		if len(rest) < 1+n+8 {
			return s, fmt.Errorf("store: corrupt item of %d bytes", len(v))
		}
		s.marks = append(s.marks, mark{writer: string(rest[1 : 1+n]), seq: int64(binary.BigEndian.Uint64(rest[1+n:]))})
		rest = rest[1+n+8:]
	}
	return s, nil
}

func (s boltShard) encode() []byte {
	v := binary.BigEndian.AppendUint64(nil, uint64(s.count))
	v = binary.BigEndian.AppendUint64(v, uint64(s.updatedAt))
	v = binary.BigEndian.AppendUint64(v, uint64(s.floor))
	for _, m := range s.marks {
		v = append(v, byte(len(m.writer)))
		v = append(v, m.writer...)
		v = binary.BigEndian.AppendUint64(v, uint64(m.seq))
	}
	if len(s.positions) == 0 {
		return v // as items were before positions
	}
	v = append(v, boltPositions)
	for _, p := range s.positions {
		v = append(v, byte(len(p.slot)))
		v = append(v, p.slot...)
		v = binary.BigEndian.AppendUint64(v, uint64(p.Epoch))
		v = binary.BigEndian.AppendUint64(v, p.Seq)
	}
	return v
}

// decodePositions reads the positions section of an item, past its
// boltPositions byte.
func decodePositions(rest []byte) ([]streamPosition, error) {
	var out []streamPosition
	for len(rest) > 0 {
		n := int(rest[0])
		if len(rest) < 1+n+16 {
			return nil, errors.New("positions cut short")
		}
		out = append(out, streamPosition{slot: string(rest[1 : 1+n]), Position: Position{
			Epoch: int64(binary.BigEndian.Uint64(rest[1+n:])),
			Seq:   binary.BigEndian.Uint64(rest[1+n+8:]),
		}})
		rest = rest[1+n+16:]
	}
	return out, nil
}

// record is what decides a span write of slot (stream.epoch) on the item.
func (s boltShard) record(slot string) recorded {
	r := recorded{count: s.count}
	if i := slices.IndexFunc(s.positions, func(p streamPosition) bool { return p.slot == slot }); i >= 0 {
		r.pos, r.has = s.positions[i].Position, true
	}
	return r
}

// setPosition records p as slot's position (stream.epoch).
func (s *boltShard) setPosition(slot string, p Position) {
	if i := slices.IndexFunc(s.positions, func(q streamPosition) bool { return q.slot == slot }); i >= 0 {
		s.positions[i].Position = p
		return
	}
	s.positions = append(s.positions, streamPosition{slot: slot, Position: p})
}

// Add applies one idempotent increment atomically, with the same marks and
// answers as DynamoDB's (a local write is never in doubt, but a
// quarantine replay cut off sends writes again). An increment that would overflow int64 fails
// with ErrOverflow and changes nothing.
func (b *Bolt) Add(ctx context.Context, w Write, now time.Time) error {
	if w.Span != nil {
		return b.addSpan(w, now)
	}
	b.metrics.writes.Inc()
	key := []byte(w.Key())
	if len(w.Writer) > maxBoltWriter {
		return fmt.Errorf("store: update %s: writer id of %d bytes, longer than %d", key, len(w.Writer), maxBoltWriter)
	}
	var refused error
	var resolved string
	err := b.group.do(func(tx *bolt.Tx) error {
		refused, resolved = nil, "" // the group may run this again
		bk := tx.Bucket(boltBucket)
		s, err := decodeShard(bk.Get(key))
		if err != nil {
			return err
		}
		i := slices.IndexFunc(s.marks, func(m mark) bool { return m.writer == w.Writer })
		switch {
		case i >= 0 && s.marks[i].seq >= w.Seq && (w.Retry || w.Replay):
			resolved = ResolvedApplied
			return nil
		case i >= 0 && s.marks[i].seq >= w.Seq:
			refused = fmt.Errorf("store: update %s: refused, a newer write of writer %s is on the item", key, w.Writer)
			return nil
		case i < 0 && s.floor >= w.Seq && (w.Retry || w.Replay):
			resolved, refused = ResolvedUnresolvable, fmt.Errorf("store: update %s: %w", key, ErrUnresolvable)
			return nil
		case i < 0 && s.floor >= w.Seq:
			refused = &FloorError{Key: string(key), Floor: s.floor}
			return nil
		}
		if (w.Delta > 0 && s.count > math.MaxInt64-w.Delta) || (w.Delta < 0 && s.count < math.MinInt64-w.Delta) {
			return ErrOverflow
		}
		if w.Retry {
			resolved = ResolvedNotApplied
		}
		s.count += w.Delta
		s.updatedAt = schema.UnixMilli(now)
		if i >= 0 {
			s.marks[i].seq = w.Seq
		} else {
			s.marks = append(s.marks, mark{writer: w.Writer, seq: w.Seq})
		}
		if drop, floor := toTrim(s.marks, now); len(drop) > 0 {
			s.marks = slices.DeleteFunc(s.marks, func(m mark) bool { return slices.Contains(drop, m) })
			s.floor = max(s.floor, floor)
		}
		return bk.Put(key, s.encode())
	})
	if err != nil {
		err = fmt.Errorf("store: update %s: %w", key, err)
		b.metrics.failed("write", err)
		return err
	}
	if resolved != "" && w.Retry {
		b.metrics.resolved.WithLabelValues(resolved).Inc()
	}
	return refused
}

// addSpan is Add for a write with a Span, with DynamoDB's answers (see
// DynamoDB.addSpan), in one transaction: no marks, no trims.
func (b *Bolt) addSpan(w Write, now time.Time) error {
	key := w.Key()
	if err := w.Span.check(); err != nil {
		return fmt.Errorf("store: update %s: %w", key, err)
	}
	b.metrics.writes.Inc()
	var refused error
	err := b.group.do(func(tx *bolt.Tx) error {
		refused = nil // the group may run this again
		bk := tx.Bucket(boltBucket)
		s, err := decodeShard(bk.Get([]byte(key)))
		if err != nil {
			return err
		}
		r := s.record(slot(w.Span.Stream, w.Span.Epoch))
		if v := judge(*w.Span, w.Delta, r); v != applies {
			// Reported aside, not as the function's error: a refusal
			// changes nothing and must not make the group run again.
			refused = refusal(key, *w.Span, w.Delta, r, v)
			return nil
		}
		s.count += w.Delta
		s.updatedAt = schema.UnixMilli(now)
		s.setPosition(slot(w.Span.Stream, w.Span.Epoch), Position{Epoch: w.Span.Epoch, Seq: w.Span.Last})
		return bk.Put([]byte(key), s.encode())
	})
	if err != nil {
		err = fmt.Errorf("store: update %s: %w", key, err)
		b.metrics.failed("write", err)
		return err
	}
	if errors.Is(refused, ErrOverflow) {
		b.metrics.failed("write", refused)
	}
	if w.Retry {
		b.metrics.settleSpan(refused)
	}
	return refused
}

// Position reads the position the item key records for stream as created
// at epoch; has is false when it records none.
func (b *Bolt) Position(ctx context.Context, key, stream string, epoch int64) (p Position, has bool, err error) {
	if err := checkStream(stream); err != nil {
		return Position{}, false, fmt.Errorf("store: position of %s: %w", key, err)
	}
	err = b.db.View(func(tx *bolt.Tx) error {
		s, err := decodeShard(tx.Bucket(boltBucket).Get([]byte(key)))
		r := s.record(slot(stream, epoch))
		p, has = r.pos, r.has
		return err
	})
	if err != nil {
		return Position{}, false, fmt.Errorf("store: item %s: %w", key, err)
	}
	return p, has, nil
}

// Gather reads shards 0..n-1 of topic in one read transaction, which (unlike
// DynamoDB) is a consistent snapshot; consistent is accepted for the shared
// interface and changes nothing.
func (b *Bolt) Gather(ctx context.Context, topic string, n int, consistent bool) ([]schema.Shard, error) {
	m, err := b.GatherMany(ctx, []string{topic}, n, consistent)
	if err != nil {
		return nil, err
	}
	return m[topic], nil
}

// GatherMany is Gather for several topics, in one read transaction. Like
// DynamoDB's, it reads at least n shards and all that the metadata says.
func (b *Bolt) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	b.metrics.gathers.Add(float64(len(topics)))
	out := make(map[string][]schema.Shard, len(topics))
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		for _, topic := range topics {
			m, err := boltMeta(bk, topic)
			if err != nil {
				return err
			}
			shards := make([]schema.Shard, max(n, m.Read()))
			b.metrics.reads.Add(float64(len(shards) + 1))
			for i := range shards {
				shards[i].Shard = i
				sh, err := decodeShard(bk.Get([]byte(schema.ShardKey(topic, i))))
				if err != nil {
					return err
				}
				shards[i].Count, shards[i].UpdatedAt = sh.count, sh.updatedAt
			}
			out[topic] = shards
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("store: gather %s: %w", schema.Named(topics), err)
		b.metrics.failed("read", err)
		return nil, err
	}
	return out, nil
}

// boltMeta reads topic's metadata: two big-endian int64s, shards and
// readShards, under MetaKey.
func boltMeta(bk *bolt.Bucket, topic string) (schema.Meta, error) {
	s, r, err := decodeItem(bk.Get([]byte(schema.MetaKey(topic))))
	if err != nil || s == 0 {
		return schema.Meta{}, err
	}
	return schema.Meta{Shards: int(s), ReadShards: int(r)}, nil
}

// Counts reads the count of each item in keys (see DynamoDB.Counts); a
// missing item counts 0. Buckets past their retention are not deleted from
// the embedded store: readers never ask for them.
func (b *Bolt) Counts(ctx context.Context, keys []string, consistent bool) (map[string]int64, error) {
	out := make(map[string]int64, len(keys))
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		for _, k := range keys {
			if _, dup := out[k]; dup {
				continue
			}
			b.metrics.reads.Inc()
			sh, err := decodeShard(bk.Get([]byte(k)))
			if err != nil {
				return fmt.Errorf("store: item %s: %w", k, err)
			}
			out[k] = sh.count
		}
		return nil
	})
	if err != nil {
		b.metrics.failed("read", err)
		return nil, err
	}
	return out, nil
}

// MarkHistory lowers the fleet's history start to t if it is later or
// unset (see DynamoDB.MarkHistory).
func (b *Bolt) MarkHistory(ctx context.Context, t time.Time) error {
	return b.group.do(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		if v := bk.Get([]byte(schema.HistoryKey)); len(v) == 8 && int64(binary.BigEndian.Uint64(v)) <= t.Unix() {
			return nil
		}
		return bk.Put([]byte(schema.HistoryKey), binary.BigEndian.AppendUint64(nil, uint64(t.Unix())))
	})
}

// HistoryStart reads the fleet's history start (zero when unmarked).
func (b *Bolt) HistoryStart(ctx context.Context) (time.Time, error) {
	var since int64
	err := b.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(boltBucket).Get([]byte(schema.HistoryKey)); len(v) == 8 {
			since = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	if err != nil || since == 0 {
		return time.Time{}, err
	}
	return time.Unix(since, 0).UTC(), nil
}

// Metas reads the metadata of topics (zero Meta for those without).
func (b *Bolt) Metas(ctx context.Context, topics []string) (map[string]schema.Meta, error) {
	out := make(map[string]schema.Meta, len(topics))
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
func (b *Bolt) SetMeta(ctx context.Context, topic string, old, m schema.Meta) error {
	b.metrics.metaWrites.Inc()
	// Grouped, as counts are: a first flush records many new topics at
	// once, and one fsync per topic would stall it. The function is safe to
	// run again (it re-reads what it checks), as the group may.
	var conflict bool
	err := b.group.do(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		cur, err := boltMeta(bk, topic)
		if err != nil {
			return err
		}
		if conflict = cur != old; conflict {
			return nil // changes nothing: no need to fail the group
		}
		var v [boltItemLen]byte
		binary.BigEndian.PutUint64(v[:], uint64(m.Shards))
		binary.BigEndian.PutUint64(v[8:], uint64(m.ReadShards))
		return bk.Put([]byte(schema.MetaKey(topic)), v[:])
	})
	if err == nil && conflict {
		err = fmt.Errorf("store: set shards of %q: %w", topic, ErrConflict)
	}
	return err
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

// Close waits for the transaction in progress and releases the file. Calls
// after Close fail.
func (b *Bolt) Close() error {
	b.group.close()
	return b.db.Close()
}

// Records reads the items keys name (see DynamoDB.Records), in one read
// transaction.
func (b *Bolt) Records(ctx context.Context, keys []string) (map[string][]Record, error) {
	out := make(map[string][]Record, len(keys))
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		for _, k := range keys {
			b.metrics.reads.Inc()
			out[k] = nil
			v := bk.Get([]byte(k))
			if v == nil {
				continue
			}
			sh, err := decodeShard(v)
			if err != nil {
				return fmt.Errorf("store: item %s: %w", k, err)
			}
			r := Record{Count: sh.count}
			for _, p := range sh.positions {
				s, ok := parseSlot(PositionPrefix + p.slot)
				if !ok {
					return fmt.Errorf("store: item %s: position slot %q", k, p.slot)
				}
				if r.Positions == nil {
					r.Positions = make(map[Slot]uint64)
				}
				r.Positions[s] = p.Seq
			}
			out[k] = []Record{r}
		}
		return nil
	})
	if err != nil {
		b.metrics.failed("read", err)
		return nil, err
	}
	return out, nil
}
