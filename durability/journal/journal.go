// Package journal makes JetStream mode count every mention once across a
// sidecar's crash. Without it, a sidecar killed after its writes and before
// its acknowledgements leaves messages that JetStream redelivers to another
// sidecar, which counts them again.
//
// With it, a flush records its writes (each a store.Write with its writer
// id and seq) and the positions (streams.Position: stream sequences, by
// partition in partitioned mode) of the messages behind them in a
// JetStream key-value bucket before it acknowledges those messages. From
// then on the journal, not the messages, carries the counts:
//
//   - The writer sends its journaled writes until each is in the store
//     (idempotent: a write sent twice applies once), flushes its
//     acknowledgements to the server, then deletes the entry.
//   - A writer that dies leaves its entries. Every sidecar runs Run, which
//     finds the entries of writers whose heartbeat has expired, sends their
//     writes again under the dead writer's identity (so the store's marks
//     refuse those already applied), and marks them done. A done entry is
//     deleted once the consumer's ack floor has passed its messages.
//   - A message redelivered after its writer died may be covered by an
//     entry: Covered says so, and the ingest acknowledges it without
//     counting it again.
package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/durability/quarantine"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/waits"
	"github.com/hotcount/hotcount/pipeline/store"
)

// Defaults and fixed parts of the scheme.
const (
	// DefaultBucket holds the entries, key <writer>.<n>.
	DefaultBucket = "hotcount_journal"
	// PartitionsBucket holds partitioned mode's entries: their messages
	// are named by streams.Position, whose partition 0 reads like a bare
	// stream sequence, so they never share a bucket with another layout's
	// (jetstream mode's, or the previous release's single partitioned
	// stream's), whose sequences would be taken for theirs.
	PartitionsBucket = "hotcount_journal_partitions"
	// DefaultWritersBucket holds one key per live writer, refreshed every
	// Heartbeat; the bucket's MaxAge (Lease) removes a dead writer's key.
	DefaultWritersBucket = "hotcount_writers"
	// Lease is how long a writer's heartbeat lasts. A dead writer's entries
	// are replayed at most about Lease + ReplayEvery after it died, well
	// within store.MarkMinAge, which keeps its marks.
	Lease = 30 * time.Second
	// Heartbeat is how often a live writer refreshes its key.
	Heartbeat = 5 * time.Second
	// ReplayEvery is how often Run looks for dead writers' entries.
	ReplayEvery = 5 * time.Second
	// maxEntryWrites bounds the writes of one entry, so that an entry stays
	// far below NATS's default 1 MB payload (a write takes under 100 bytes).
	maxEntryWrites = 4000
	// replayConcurrency is how many of a dead writer's writes are sent at
	// once.
	replayConcurrency = 16
)

// Store is what a replay writes to: the store's idempotent Add.
type Store interface {
	Add(ctx context.Context, w store.Write, now time.Time) error
}

// Entry is one journal entry: writes of one flush (or part of it) and the
// stream sequences of the messages whose counts they carry.
type Entry struct {
	Writer string     `json:"writer"`
	Writes []Write    `json:"writes"`
	Seqs   [][2]int64 `json:"seqs"` // inclusive ranges of streams.Positions
	Done   bool       `json:"done,omitempty"`
	// Region is the Region whose items its writes went to (store.Regions;
	// "" the single-Region layout): a replay writes the same items or
	// none, since a mark only guards its own item.
	Region string `json:"region,omitempty"`
}

// Write is a store.Write as journaled: its counter by name
// (store.Counter.Name), the encoding entries have always held, read back
// once (store.ParseName) when a replay sends it.
type Write struct {
	Name  string `json:"t"`
	Shard int    `json:"s"`
	Delta int64  `json:"d"`
	Seq   int64  `json:"q"`
	// Quarantined says the write is the quarantine's now (the store
	// refused it for good, package quarantine): a replay leaves it.
	Quarantined bool `json:"x,omitempty"`
}

// Journal is one sidecar's journal. Record, Settled and Covered are safe for
// concurrent use with Run and Watch. Run owns the heartbeat and the
// replays; Watch, the copy of the entries Covered reads.
type Journal struct {
	nc      *nats.Conn
	kv      jetstream.KeyValue
	writers jetstream.KeyValue
	floor   func(ctx context.Context) (floors, error) // ackFloor's
	writer  string
	release func(ctx context.Context, writer string, seq int64) error // Config.Release; nil: none
	// hold and quarantineAfter are Config's; refused is when a replay's
	// write was first refused for good, by entry and counter (Run's).
	hold            func(ctx context.Context, e quarantine.Entry) error
	quarantineAfter time.Duration
	refused         map[string]time.Time
	foreign         map[string]bool // entries of another Region, logged (Run's)
	st              Store
	region          string // Config.Region
	log             *zap.Logger
	m               *Metrics

	lastBeat atomic.Int64 // Unix ns of the last heartbeat that succeeded
	lapsed   atomic.Int64 // Unix ns of the last heartbeat after a gap of over Lease/2

	mu          sync.Mutex
	n           int64                 // entries recorded by this writer
	unconfirmed map[string][]byte     // entries whose put's answer was lost
	last        map[string][][2]int64 // this writer's entries not retired: the messages they cover
	floorV      floors                // the ack floors last read (cachedFloor)
	floorErr    error                 // the last reading's failure, if it failed
	floorAt     time.Time             // the last reading, failed or not
	floorRead   time.Time             // the reading floorV is
	passed      map[string]time.Time  // entry -> the first reading seen past it (confirmed)

	cover *coverage // which messages the entries carry (Covered); Run keeps it
}

// Config names the buckets and the consumer whose ack floor retires done
// entries.
type Config struct {
	Bucket, WritersBucket string
	Stream, Consumer      string
	// Partitions, in partitioned mode, is the count of partition streams
	// (streams.Layout), each with its Consumer.
	Partitions int
	// Replicas of the buckets; 0: as the stream's.
	Replicas int
	// Release, when set, is called by a replay for each write the entry
	// marks as the quarantine's (Quarantine), with the write's writer and
	// seq, before the entry is finished: the quarantine must know the
	// hand-over done before the entry can go (quarantine.Release).
	Release func(ctx context.Context, writer string, seq int64) error
	// Hold and QuarantineAfter: a replay whose write the store has
	// refused for good (store.Denied) for QuarantineAfter puts it in the
	// quarantine with Hold, under its writer's own identity (the dead
	// writer may have applied it; its id is never used again, so its mark
	// tells), marks it in the entry and releases it, so that one poison
	// write does not hold a dead writer's entry, and its replays, for
	// ever. Nil or 0: never.
	Hold            func(ctx context.Context, e quarantine.Entry) error
	QuarantineAfter time.Duration
	// Region is the store's own Region (store.Regions.Own): entries
	// record it, and a replay leaves an entry of another Region alone.
	Region string
}

// Open creates or binds the buckets. writer is this sidecar's writer id.
// Nothing starts until Run.
func Open(ctx context.Context, nc *nats.Conn, cfg Config, writer string, st Store, log *zap.Logger, m *Metrics) (*Journal, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("journal: jetstream: %w", err)
	}
	if cfg.Replicas == 0 {
		// As many as the stream: a journal on fewer nodes than the
		// mentions it covers would stop the flushes when its node goes.
		// A stream not there yet: one replica for now; the next start
		// after it is created brings the buckets to its count.
		cfg.Replicas = 1
		if s, err := js.Stream(ctx, cfg.streamOf(0)); err == nil {
			cfg.Replicas = s.CachedInfo().Config.Replicas
		}
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "hotcount: writes recorded before their messages are acknowledged",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("journal: bucket %s: %w", cfg.Bucket, err)
	}
	writers, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.WritersBucket,
		Description: "hotcount: live writers (heartbeats)",
		History:     1,
		TTL:         Lease,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("journal: bucket %s: %w", cfg.WritersBucket, err)
	}
	j := &Journal{nc: nc, kv: kv, writers: writers, release: cfg.Release, hold: cfg.Hold, quarantineAfter: cfg.QuarantineAfter, refused: make(map[string]time.Time), foreign: make(map[string]bool), region: cfg.Region, floor: ackFloor(js, cfg), writer: writer, st: st, log: log.Named("journal"), m: m,
		unconfirmed: make(map[string][]byte), last: make(map[string][][2]int64), passed: make(map[string]time.Time), cover: newCoverage()}
	if err := j.beat(ctx); err != nil {
		return nil, err
	}
	return j, nil
}

// streamOf is the stream partition p's messages are in: the stream, or in
// partitioned mode the partition's stream.
func (cfg Config) streamOf(p int) string {
	if cfg.Partitions == 0 {
		return cfg.Stream
	}
	return streams.Layout{Stream: cfg.Stream, Partitions: cfg.Partitions}.Name(p)
}

// floors are the consumers' ack floors by partition (0 alone outside
// partitioned mode): the stream sequence at or below which every message
// delivered to the sidecars is acknowledged.
type floors map[int]uint64

// past says whether every message of rs (ranges of streams.Positions) is at
// or below its partition's floor.
func (f floors) past(rs [][2]int64) bool {
	for _, r := range rs {
		if p, seq := streams.Split(r[1]); seq > f[p] {
			return false
		}
	}
	return true
}

// ackFloor returns a function reading the floors: each consumer's ack
// floor, or all it delivered when nothing is outstanding. A partition
// whose consumer does not exist yet has delivered nothing (floor 0).
func ackFloor(js jetstream.JetStream, cfg Config) func(ctx context.Context) (floors, error) {
	return func(ctx context.Context) (floors, error) {
		n := max(cfg.Partitions, 1)
		read := make([]uint64, n)
		// One request per consumer (looking it up returns its info), all
		// at once: one after another, 16 partitions on a busy server ran
		// past the retirement's half second.
		g, gctx := errgroup.WithContext(ctx)
		for p := range n {
			g.Go(func() error {
				c, err := js.Consumer(gctx, cfg.streamOf(p), cfg.Consumer)
				if errors.Is(err, jetstream.ErrConsumerNotFound) && cfg.Partitions > 0 {
					return nil
				}
				if err != nil {
					return fmt.Errorf("journal: consumer %s of %s: %w", cfg.Consumer, cfg.streamOf(p), err)
				}
				info := c.CachedInfo()
				read[p] = info.AckFloor.Stream
				if info.NumAckPending == 0 {
					read[p] = info.Delivered.Stream
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
		f := make(floors, n)
		for p, seq := range read {
			f[p] = seq
		}
		return f, nil
	}
}

// Recorded is an entry as the flusher tracks it: its key and the counters
// of its writes. Unconfirmed: the put's answer was lost, so the entry may
// or may not be in the bucket; Confirm settles it. Until then its messages
// must not be acknowledged (if it is not there, they carry the counts) and
// its writes must not be sent (if it is there, a replay may send them).
type Recorded struct {
	Key         string
	Counters    []store.Counter
	Unconfirmed bool
}

// Record journals writes, with the stream sequences of the messages behind
// each topic (seqs, by topic: with its total's write), in entries of about
// maxEntryWrites writes, never parting a topic's adjacent writes. It
// returns the entries recorded, the last perhaps unconfirmed; on error, the
// writes of the entries not returned were not sent, and their messages
// must not be acknowledged.
func (j *Journal) Record(ctx context.Context, writes []store.Write, seqs map[string][]int64) ([]Recorded, error) {
	var out []Recorded
	for start, end := 0, 0; start < len(writes); start = end {
		// A topic's writes (its total and its time buckets, adjacent in
		// writes) share an entry: they are journaled together or not at
		// all, as their messages are acknowledged.
		end = min(start+maxEntryWrites, len(writes))
		for end < len(writes) && writes[end].Counter.Topic == writes[end-1].Counter.Topic {
			end++
		}
		part := writes[start:end]
		e := Entry{Writer: j.writer, Region: j.region}
		rec := Recorded{}
		var covered []int64
		for _, w := range part {
			e.Writes = append(e.Writes, Write{Name: w.Counter.Name(), Shard: w.Shard, Delta: w.Delta, Seq: w.Seq})
			rec.Counters = append(rec.Counters, w.Counter)
			if w.Counter.Kind == store.Total {
				covered = append(covered, seqs[w.Counter.Topic]...)
			}
		}
		e.Seqs = toRanges(covered)
		b, err := json.Marshal(e)
		if err != nil {
			return out, fmt.Errorf("journal: encode: %w", err)
		}
		j.mu.Lock()
		j.n++
		rec.Key = j.writer + "." + strconv.FormatInt(j.n, 10)
		j.last[rec.Key] = e.Seqs
		j.mu.Unlock()
		if err := j.create(ctx, rec.Key, b); err != nil {
			j.mu.Lock()
			j.unconfirmed[rec.Key] = b
			j.mu.Unlock()
			rec.Unconfirmed = true
			return append(out, rec), err
		}
		j.cover.note(rec.Key, e.Seqs) // before the watch brings it back
		j.m.recorded.Inc()
		out = append(out, rec)
	}
	return out, nil
}

// createTries is how many times create tries an entry's put: with
// createBackOff's waits (about 100 ms, then 200 ms) a NATS hiccup of a
// few hundred milliseconds passes without failing the flush's journal.
const createTries = 3

// createBackOff is the wait between create's tries: for JetStream.
func createBackOff() backoff.BackOff { return waits.Reconnect() }

// create puts a new entry, trying again (it is the same Create, so a
// second try finding the key means the first landed) a few times
// (createTries), and not after ctx ends.
func (j *Journal) create(ctx context.Context, key string, b []byte) error {
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		_, err := j.kv.Create(ctx, key, b)
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return struct{}{}, err
		}
		return struct{}{}, nil
	}, backoff.WithBackOff(createBackOff()), backoff.WithMaxTries(createTries), backoff.WithMaxElapsedTime(0))
	if err != nil {
		j.m.errors.WithLabelValues("record").Inc()
		return fmt.Errorf("journal: record %s: %w", key, err)
	}
	return nil
}

// Confirm settles an unconfirmed entry: true once it is surely in the
// bucket (it is put again if it was not).
func (j *Journal) Confirm(ctx context.Context, key string) (bool, error) {
	j.mu.Lock()
	b, ok := j.unconfirmed[key]
	j.mu.Unlock()
	if !ok {
		return true, nil
	}
	if err := j.create(ctx, key, b); err != nil {
		return false, err
	}
	j.mu.Lock()
	delete(j.unconfirmed, key)
	j.mu.Unlock()
	j.m.recorded.Inc()
	return true, nil
}

// Rewrite gives the write of c in an entry a new seq (the store refused
// its seq as below an item's floor, so it was not applied).
func (j *Journal) Rewrite(ctx context.Context, key string, c store.Counter, seq int64) error {
	err := j.change(ctx, key, c, func(_ Entry, w *Write) error { w.Seq = seq; return nil })
	if err != nil {
		return fmt.Errorf("journal: rewrite %s: %w", key, err)
	}
	return nil
}

// change applies fn to the write of c in entry key (each, if several),
// as one compare-and-set of the entry: a concurrent change (a replay by
// another sidecar) makes it fail rather than be lost.
func (j *Journal) change(ctx context.Context, key string, c store.Counter, fn func(e Entry, w *Write) error) error {
	e, rev, err := read(ctx, j.kv, key)
	if err != nil {
		return err
	}
	name := c.Name()
	for i := range e.Writes {
		if e.Writes[i].Name == name {
			if err := fn(e, &e.Writes[i]); err != nil {
				return err
			}
		}
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = j.kv.Update(ctx, key, b, rev)
	return err
}

// read returns entry key of kv and its revision.
func read(ctx context.Context, kv jetstream.KeyValue, key string) (Entry, uint64, error) {
	var e Entry
	kve, err := kv.Get(ctx, key)
	if err != nil {
		return e, 0, err
	}
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return e, 0, err
	}
	return e, kve.Revision(), nil
}

// Quarantine marks the journaled write of c in entry key as the
// quarantine's, which holds it already: from then on a replay of the
// entry leaves it, so that it is written once, by `hotcount quarantine
// replay`. It is the step that hands the write over (see
// quarantine.Entry.Released).
func (j *Journal) Quarantine(ctx context.Context, key string, c store.Counter) error {
	err := j.change(ctx, key, c, func(e Entry, w *Write) error {
		if e.Done {
			// Replayed by another sidecar meanwhile: the write is in
			// the store, and must not be quarantined too.
			return ErrReplayed
		}
		w.Quarantined = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("journal: quarantine %s: %w", key, err)
	}
	return nil
}

// ErrReplayed is Quarantine's answer for an entry another sidecar has
// replayed: its writes are in the store.
var ErrReplayed = errors.New("journal: entry already replayed")

// Holds says how entry key of bucket holds the write of counter name:
// found (the entry is there and has it) and whether it is quarantined.
// `hotcount quarantine replay` asks it of an entry whose hand-over it
// cannot see finished.
func Holds(ctx context.Context, kv jetstream.KeyValue, key, name string) (found, quarantined bool, err error) {
	e, _, err := read(ctx, kv, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("journal: %s: %w", key, err)
	}
	for _, w := range e.Writes {
		if w.Name == name {
			return true, w.Quarantined, nil
		}
	}
	return false, false, nil
}

// MaybeReplayed says whether another sidecar may have replayed an entry
// recorded at t: this writer's heartbeat may have lapsed since (a gap of
// more than half the lease between two good heartbeats, or none lately).
// Its writes then may be in the store already, applied by the replay.
func (j *Journal) MaybeReplayed(t time.Time) bool {
	last := time.Unix(0, j.lastBeat.Load())
	return time.Unix(0, j.lapsed.Load()).After(t) || time.Since(last) > Lease/2
}

// ErrNotAcknowledged is Settled's answer for an entry whose messages the
// consumer has not all recorded as acknowledged yet: it stays, and is
// retired by a later call.
var ErrNotAcknowledged = errors.New("journal: messages not all acknowledged yet")

// Settled retires an entry of this writer whose writes are all in the
// store, once the consumer's ack floor is past every message it covers,
// confirmed (see confirmed). Until then a message of it may still be
// redelivered (an acknowledgement the server received but lost: a NATS
// node that died before the consumer recorded it), and the entry keeps its
// count from being counted again. It flushes the acknowledgements sent so
// far first, so that the floor is as high as it can be.
func (j *Journal) Settled(ctx context.Context, key string) error {
	j.mu.Lock()
	covers, known := j.last[key]
	j.mu.Unlock()
	if known {
		floor, read, err := j.cachedFloor(ctx)
		if err != nil {
			return err
		}
		if !j.confirmed(key, floor.past(covers), read) {
			return ErrNotAcknowledged
		}
	}
	if err := j.kv.Delete(ctx, key); err != nil {
		j.m.errors.WithLabelValues("retire").Inc()
		return fmt.Errorf("journal: retire %s: %w", key, err)
	}
	j.mu.Lock()
	delete(j.last, key)
	delete(j.passed, key)
	j.mu.Unlock()
	return nil
}

// floorConfirm is how far apart two readings of the ack floors must both
// pass an entry before it is retired. A consumer's leader reports an
// acknowledgement as soon as it has it, before its followers do: a leader
// lost in between takes the acknowledgement with it, its successor's floor
// is lower, and the message comes back. A reading floorConfirm after the
// first comes from the successor if the leader was lost meanwhile, and
// shows the lower floor; so the bound is how long a leader may hold an
// acknowledgement its followers lack. 3 s was not enough: the cluster test
// (three servers, four sidecars and 16 partition streams on two busy
// cores) over-counted in 3 of 6 runs with it, from redelivered messages
// whose entries were gone; with 10 s it was exact in every run since.
const floorConfirm = 10 * time.Second

// confirmed says whether an entry whose messages the reading at read found
// acknowledged (past) was found so floorConfirm earlier too, remembering
// the first such reading.
func (j *Journal) confirmed(key string, past bool, read time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	first, seen := j.passed[key]
	switch {
	case !past:
		delete(j.passed, key) // a lower floor: a leader's successor
		return false
	case !seen:
		j.passed[key] = read
		return false
	}
	return read.Sub(first) >= floorConfirm
}

// floorFresh is how long Settled trusts an ack floor it read (or a failure
// to read it): the floor only rises, so an old one only delays a
// retirement, and reading it costs a request per consumer (per partition
// in partitioned mode).
const floorFresh = 2 * time.Second

// cachedFloor is the ack floor (ackFloor's), read at most every floorFresh,
// after the acknowledgements sent so far have reached the server, and when
// it was read.
func (j *Journal) cachedFloor(ctx context.Context) (floors, time.Time, error) {
	j.mu.Lock()
	floor, ferr, at, read := j.floorV, j.floorErr, j.floorAt, j.floorRead
	j.mu.Unlock()
	if time.Since(at) < floorFresh {
		return floor, read, ferr
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second) // or the caller's, if sooner
	defer cancel()
	if ferr = j.nc.FlushWithContext(fctx); ferr != nil {
		ferr = fmt.Errorf("journal: flush acknowledgements: %w", ferr)
	} else {
		floor, ferr = j.floor(fctx)
	}
	j.mu.Lock()
	if ferr == nil {
		j.floorV, j.floorRead = floor, time.Now()
	}
	j.floorErr, j.floorAt = ferr, time.Now()
	floor, read = j.floorV, j.floorRead
	j.mu.Unlock()
	return floor, read, ferr
}

// Covered says whether the message at position seq is carried by a
// journal entry: a redelivery of a message whose count is already
// journaled, to acknowledge without counting. It answers from the copy of
// the entries Run keeps (coverage), once Run has read them all.
func (j *Journal) Covered(ctx context.Context, seq int64) (bool, error) {
	return j.cover.covered(ctx, seq)
}

// each calls fn for every entry in the bucket whose writer want accepts
// (nil: all), reading only those.
func (j *Journal) each(ctx context.Context, want func(writer string) bool, fn func(key string, e Entry, rev uint64) error) error {
	keys, err := j.keys(ctx, j.kv)
	if err != nil {
		return fmt.Errorf("journal: list: %w", err)
	}
	for _, k := range keys {
		if want != nil && !want(WriterOf(k)) {
			continue
		}
		kve, err := j.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // retired meanwhile
		}
		if err != nil {
			return fmt.Errorf("journal: get %s: %w", k, err)
		}
		var e Entry
		if err := json.Unmarshal(kve.Value(), &e); err != nil {
			j.log.Error("unreadable journal entry left alone", zap.String("key", k), zap.Error(err))
			continue
		}
		if err := fn(k, e, kve.Revision()); err != nil {
			return err
		}
	}
	return nil
}

// keys lists a bucket's keys (none is not an error).
func (j *Journal) keys(ctx context.Context, kv jetstream.KeyValue) ([]string, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	defer lister.Stop() //nolint:errcheck // a listing's end
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}

// Run refreshes this writer's heartbeat and replays dead writers' entries
// until ctx ends. It leaves the heartbeat in the bucket: Leave removes it,
// once the final flush is done, so that what this writer leaves unsettled
// is replayed at once (otherwise it is when the lease runs out). It
// replays first as it starts: a sidecar that replaces one which left the
// journal (a rolling update) writes what that one left without waiting
// ReplayEvery.
func (j *Journal) Run(ctx context.Context) error {
	beat := time.NewTicker(Heartbeat)
	defer beat.Stop()
	replay := time.NewTicker(ReplayEvery)
	defer replay.Stop()
	if err := j.Replay(ctx); err != nil && ctx.Err() == nil {
		j.log.Warn("replay", zap.Error(err))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-beat.C:
			if err := j.beat(ctx); err != nil && ctx.Err() == nil {
				j.log.Warn("heartbeat", zap.Error(err))
			}
		case <-replay.C:
			if err := j.Replay(ctx); err != nil && ctx.Err() == nil {
				j.log.Warn("replay", zap.Error(err))
			}
		}
	}
}

// Watch keeps the copy of the entries Covered reads (coverage) until ctx
// ends.
func (j *Journal) Watch(ctx context.Context) error {
	j.cover.watch(ctx, j.kv, j.log)
	return nil
}

// Leave removes this writer's heartbeat: called once it writes no more
// (after the final flush), so that its unsettled entries, if any, are
// replayed by the other sidecars without waiting for the lease.
func (j *Journal) Leave(ctx context.Context) error {
	return j.writers.Delete(ctx, j.writer)
}

func (j *Journal) beat(ctx context.Context) error {
	if _, err := j.writers.Put(ctx, j.writer, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		return fmt.Errorf("journal: heartbeat: %w", err)
	}
	now := time.Now()
	if prev := j.lastBeat.Swap(now.UnixNano()); prev != 0 && now.Sub(time.Unix(0, prev)) > Lease/2 {
		j.lapsed.Store(now.UnixNano())
	}
	return nil
}

// Replay sends again, under their writer's identity, the writes of every
// entry whose writer is gone, marks the entries done, and deletes done
// entries whose messages are all below the consumer's ack floor.
func (j *Journal) Replay(ctx context.Context) error {
	// One listing of the live writers; entries are read only for the dead.
	live, err := j.keys(ctx, j.writers)
	if err != nil {
		return fmt.Errorf("journal: list writers: %w", err)
	}
	alive := map[string]bool{j.writer: true}
	for _, w := range live {
		alive[w] = true
	}
	var floor floors
	var read time.Time
	seen := map[string]bool{}
	err = j.each(ctx, func(w string) bool { return !alive[w] }, func(key string, e Entry, rev uint64) error {
		seen[key] = true
		if !e.Done {
			return j.replay(ctx, key, e, rev)
		}
		if floor == nil {
			if floor, err = j.floor(ctx); err != nil {
				return err
			}
			read = time.Now()
		}
		if j.confirmed(key, floor.past(e.Seqs), read) {
			if err := j.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err == nil {
				j.m.retired.Inc()
			}
		}
		return nil
	})
	if err == nil {
		j.forget(seen)
	}
	return err
}

// forget drops the confirmations of other writers' entries that a whole
// pass of Replay did not see (deleted, by this sidecar or another).
func (j *Journal) forget(seen map[string]bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for key := range j.passed {
		if _, mine := j.last[key]; !mine && !seen[key] {
			delete(j.passed, key)
		}
	}
}

// replay sends an entry's writes as its writer and marks it done when all
// are in the store; a write that fails leaves it for the next round.
func (j *Journal) replay(ctx context.Context, key string, e Entry, rev uint64) error {
	if e.Region != j.region {
		// Its writes' items are another layout's (a sidecar that changed
		// --region, or another Region's on this NATS): written here they
		// would land on items without the dead writer's marks, and count
		// twice whatever it had applied. Left for a sidecar of its Region.
		// Logged once per entry; the other entries' replays go on.
		if !j.foreign[key] {
			j.foreign[key] = true
			j.m.errors.WithLabelValues("replay").Inc()
			j.log.Error("journal entry of another Region left alone: replay it with a sidecar of that Region (docs/SEMANTICS.md, \"Several Regions\")",
				zap.String("entry", key), zap.String("entry_region", e.Region), zap.String("region", j.region))
		}
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(replayConcurrency)
	var mu sync.Mutex
	denied := map[string]error{} // by counter name: refused for good this pass
	for _, w := range e.Writes {
		if w.Quarantined {
			// The quarantine's: `hotcount quarantine replay` writes it,
			// once its entry is released (below).
			continue
		}
		c, _ := store.ParseName(w.Name) // a damaged name reads as a total: written, not lost
		g.Go(func() error {
			sw := store.Write{Counter: c, Shard: w.Shard, Delta: w.Delta, Writer: e.Writer, Seq: w.Seq, Replay: true}
			wctx, cancel := context.WithTimeout(gctx, 10*time.Second)
			defer cancel()
			if err := j.st.Add(wctx, sw, time.Now()); err != nil && !errors.Is(err, store.ErrUnresolvable) {
				j.m.errors.WithLabelValues("replay").Inc()
				if store.Denied(err) {
					mu.Lock()
					denied[w.Name] = err
					mu.Unlock()
					return nil // the others go on; the entry waits for this one
				}
				return fmt.Errorf("journal: replay %s: %w", key, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if len(denied) > 0 {
		return j.quarantine(ctx, key, e, denied)
	}
	for _, w := range e.Writes {
		if !w.Quarantined {
			continue
		}
		if j.release == nil {
			return fmt.Errorf("journal: replay %s: a write of it is quarantined, and this sidecar has no quarantine to release it in", key)
		}
		if err := j.release(ctx, e.Writer, w.Seq); err != nil {
			return fmt.Errorf("journal: replay %s: %w", key, err)
		}
	}
	e.Done = true
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := j.kv.Update(ctx, key, b, rev); err != nil {
		return nil // another sidecar replayed it first
	}
	j.m.replayed.Inc()
	j.log.Info("replayed a dead writer's journal entry", zap.String("key", key), zap.Int("writes", len(e.Writes)))
	return nil
}

// quarantine hands the writes of a dead writer's entry key that the store
// refuses for good to the quarantine once the refusals have lasted
// quarantineAfter: put (not released, under the writer's own identity),
// marked in the entry, released. The entry is finished by a later pass,
// which leaves the marked writes. It returns an error while any write is
// left, so the entry is not finished without it.
func (j *Journal) quarantine(ctx context.Context, key string, e Entry, denied map[string]error) error {
	now := time.Now()
	left := 0
	for _, w := range e.Writes {
		err, ok := denied[w.Name]
		if !ok {
			continue
		}
		id := key + "/" + w.Name
		since, seen := j.refused[id]
		if !seen {
			since, j.refused[id] = now, now
		}
		if j.hold == nil || j.quarantineAfter <= 0 || now.Sub(since) < j.quarantineAfter {
			left++
			continue
		}
		c, _ := store.ParseName(w.Name)
		sw := store.Write{Counter: c, Shard: w.Shard, Delta: w.Delta, Writer: e.Writer, Seq: w.Seq}
		q := quarantine.Of(sw, key, err.Error(), since, now)
		q.Replay = &quarantine.Identity{Writer: e.Writer, Seq: w.Seq} // the dead writer's: its mark tells
		if err := j.hold(ctx, q); err != nil {
			return fmt.Errorf("journal: replay %s: quarantine %s: %w", key, w.Name, err)
		}
		if err := j.Quarantine(ctx, key, c); err != nil {
			return fmt.Errorf("journal: replay %s: %w", key, err)
		}
		if j.release != nil {
			if err := j.release(ctx, e.Writer, w.Seq); err != nil {
				return fmt.Errorf("journal: replay %s: %w", key, err)
			}
		}
		delete(j.refused, id)
		j.log.Error("a dead writer's journaled write refused for good since "+since.UTC().Format(time.RFC3339)+"; quarantined: `hotcount quarantine replay` writes it once the cause is fixed",
			zap.String("key", key), zap.String("counter", w.Name), zap.Int64("delta", w.Delta), zap.String("reason", err.Error()))
	}
	if left > 0 {
		return fmt.Errorf("journal: replay %s: %d writes refused for good (quarantined after %s)", key, left, j.quarantineAfter)
	}
	return nil
}

// toRanges turns positions into sorted inclusive ranges.
func toRanges(seqs []int64) [][2]int64 {
	if len(seqs) == 0 {
		return nil
	}
	s := slices.Clone(seqs)
	slices.Sort(s)
	out := [][2]int64{{s[0], s[0]}}
	for _, v := range s[1:] {
		last := &out[len(out)-1]
		if v <= last[1]+1 {
			last[1] = max(last[1], v)
		} else {
			out = append(out, [2]int64{v, v})
		}
	}
	return out
}

// WriterOf is the writer of an entry key.
func WriterOf(key string) string { w, _, _ := strings.Cut(key, "."); return w }

// Metrics are the journal's metrics.
type Metrics struct {
	recorded, replayed, retired prometheus.Counter
	errors                      *prometheus.CounterVec
}

// NewMetrics registers the journal's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		recorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_journal_recorded_total",
			Help: "Journal entries recorded (a flush's writes, before their messages are acknowledged).",
		}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_journal_replayed_total",
			Help: "Dead writers' journal entries whose writes this sidecar sent again and marked done.",
		}),
		retired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_journal_retired_total",
			Help: "Done journal entries deleted once the consumer's ack floor passed their messages.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotcount_journal_errors_total",
			Help: "Journal operations that failed, by operation (record, retire, replay).",
		}, []string{"op"}),
	}
	reg.MustRegister(m.recorded, m.replayed, m.retired, m.errors)
	for _, op := range []string{"record", "retire", "replay"} {
		m.errors.WithLabelValues(op)
	}
	return m
}

// Unsettled counts bucket's entries not yet done: writes recorded whose
// landing in the store is not yet known (their sidecar, or another's
// replay, finishes them). A bucket that does not exist has none. `hotcount
// stream adopt` hands a stream to the position engine only when it is 0.
func Unsettled(ctx context.Context, js jetstream.JetStream, bucket string) (int, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	open := 0
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // retired meanwhile
		}
		if err != nil {
			return 0, err
		}
		var entry Entry
		if err := json.Unmarshal(e.Value(), &entry); err != nil {
			return 0, fmt.Errorf("journal: entry %s: %w", k, err)
		}
		if !entry.Done {
			open++
		}
	}
	return open, nil
}

// Writers lists the writers whose heartbeat is live in bucket (the
// writers bucket): journal sidecars running, or stopped by SIGKILL less
// than Lease ago. A bucket that does not exist has none.
func Writers(ctx context.Context, js jetstream.JetStream, bucket string) ([]string, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	return keys, err
}
