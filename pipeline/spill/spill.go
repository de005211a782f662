// Package spill keeps coalesced deltas on disk when memory runs short: in
// core mode a store outage must not make the sidecar grow until the kernel
// kills it and loses everything it buffered, so the aggregator moves its
// window here past its memory budget and takes it back when the store
// writes again.
//
// A spill is a folder of segments, one per spilled window, taken back whole
// and oldest first. A segment is written to a temporary name and renamed
// into place once it is complete and synced; taking one reads it and
// removes it before its deltas are used. So a segment that exists holds
// deltas that were never handed back, and a new process on the same folder
// (a restarted container on its emptyDir) takes them up: mentions spilled
// before a crash are not lost.
package spill

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ErrFull is returned by Put when the segment would take the folder past
// its byte budget.
var ErrFull = errors.New("spill: disk budget exhausted")

// ErrCorrupt is returned by Take for a segment damaged on disk.
var ErrCorrupt = errors.New("spill: segment damaged")

const (
	prefix = "segment-"
	suffix = ".spill"
)

// Dir is a spill folder. It is safe for concurrent use, and expects to be
// the folder's only user.
type Dir struct {
	dir string
	max int64

	mu   sync.Mutex
	segs []segment // oldest first
	used int64
	next uint64
}

type segment struct {
	name   string
	size   int64
	topics int // 0 when unknown (left by an earlier process)
}

// Open opens (creating it if need be) the spill folder dir, whose segments
// may take at most budget bytes. Segments left there by an earlier process are
// kept and handed back first; unfinished ones (a crash mid-write) are
// removed: their deltas never left that process's memory.
func Open(dir string, budget int64) (*Dir, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("spill: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("spill: %w", err)
	}
	d := &Dir{dir: dir, max: budget}
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("spill: remove unfinished segment: %w", err)
			}
			continue
		}
		n, ok := segmentNumber(name)
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("spill: %w", err)
		}
		d.segs = append(d.segs, segment{name: name, size: info.Size()})
		d.used += info.Size()
		d.next = max(d.next, n+1)
	}
	// Names are zero-padded numbers: their order is the spill order.
	slices.SortFunc(d.segs, func(a, b segment) int { return strings.Compare(a.name, b.name) })
	return d, nil
}

func segmentNumber(name string) (uint64, bool) {
	if !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, suffix) {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, prefix), suffix), 10, 64)
	return n, err == nil
}

// Deltas is what a segment is written from: topics and their deltas
// (the aggregator's window is one).
type Deltas interface {
	Len() int
	All() iter.Seq2[string, int64]
}

// Size is the encoded size of deltas as a segment.
func Size(deltas Deltas) int64 {
	var n int64
	var buf [binary.MaxVarintLen64]byte
	for topic, d := range deltas.All() {
		n += int64(binary.PutUvarint(buf[:], uint64(len(topic))) + len(topic) + binary.PutUvarint(buf[:], uint64(d)))
	}
	return n
}

// Put writes deltas (non-negative) as a new segment. It fails with ErrFull,
// writing nothing, when the segment would take the folder past its budget.
// On any error the deltas are not in the folder: the caller still has them.
func (d *Dir) Put(deltas Deltas) error { return d.put(deltas, false) }

// Keep is Put past the budget: for deltas that were on disk a moment ago
// (taken back for a flush that failed) or would be lost otherwise (at the
// shutdown deadline). The folder may then pass its budget by that much.
func (d *Dir) Keep(deltas Deltas) error { return d.put(deltas, true) }

func (d *Dir) put(deltas Deltas, force bool) error {
	if deltas.Len() == 0 {
		return nil
	}
	size := Size(deltas)
	d.mu.Lock()
	if !force && d.used+size > d.max {
		d.mu.Unlock()
		return fmt.Errorf("%w: %d bytes in %d segments, budget %d, segment of %d", ErrFull, d.used, len(d.segs), d.max, size)
	}
	// Reserve the room and the name; writing happens outside the lock.
	d.used += size
	name := fmt.Sprintf("%s%020d%s", prefix, d.next, suffix)
	d.next++
	d.mu.Unlock()

	if err := d.write(name, deltas); err != nil {
		d.mu.Lock()
		d.used -= size
		d.mu.Unlock()
		return err
	}
	d.mu.Lock()
	// Names grow with each Put: sorting keeps the spill order whatever
	// order concurrent writes finish in.
	d.segs = append(d.segs, segment{name: name, size: size, topics: deltas.Len()})
	slices.SortFunc(d.segs, func(a, b segment) int { return strings.Compare(a.name, b.name) })
	d.mu.Unlock()
	return nil
}

func (d *Dir) write(name string, deltas Deltas) (err error) {
	path := filepath.Join(d.dir, name)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	w := bufio.NewWriterSize(f, 256<<10)
	var buf [2 * binary.MaxVarintLen64]byte
	for topic, delta := range deltas.All() {
		if delta < 0 {
			return fmt.Errorf("spill: negative delta %d", delta)
		}
		n := binary.PutUvarint(buf[:], uint64(len(topic)))
		if _, err := w.Write(buf[:n]); err != nil {
			return fmt.Errorf("spill: %w", err)
		}
		if _, err := w.WriteString(topic); err != nil {
			return fmt.Errorf("spill: %w", err)
		}
		n = binary.PutUvarint(buf[:], uint64(delta))
		if _, err := w.Write(buf[:n]); err != nil {
			return fmt.Errorf("spill: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	// The rename is in the folder's entry, which reaches the disk with
	// the folder's own sync: without it a power loss could leave the
	// segment's data with no name. Best effort: the segment is in place
	// now, and reporting a failure would have the caller keep its deltas
	// too, counting them twice once the segment is read back.
	if dir, err := os.Open(d.dir); err == nil {
		dir.Sync() //nolint:errcheck // see above
		dir.Close()
	}
	return nil
}

// Stats returns the bytes and segments in the folder.
func (d *Dir) Stats() (bytes int64, segments int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used, len(d.segs)
}

// Next describes the segment Take would return: its bytes, and its topics
// (0 when unknown: a segment an earlier process left). All zero if none.
func (d *Dir) Next() (bytes int64, topics int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.segs) == 0 {
		return 0, 0
	}
	return d.segs[0].size, d.segs[0].topics
}

// Take removes the oldest segment and returns its deltas; nil when the
// folder is empty. The file is gone before Take returns the deltas, so
// they are the caller's alone. A segment that cannot be parsed (damaged on
// disk) is moved aside to a ".bad" file, so that the segments behind it
// still come back, and reported with ErrCorrupt.
func (d *Dir) Take() (map[string]int64, error) {
	d.mu.Lock()
	if len(d.segs) == 0 {
		d.mu.Unlock()
		return nil, nil
	}
	seg := d.segs[0]
	d.mu.Unlock()

	path := filepath.Join(d.dir, seg.name)
	deltas, err := read(path, seg.topics)
	if errors.Is(err, ErrCorrupt) {
		if rerr := os.Rename(path, path+".bad"); rerr != nil {
			return nil, fmt.Errorf("spill: %w", rerr)
		}
		d.drop(seg)
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil {
		return nil, fmt.Errorf("spill: %w", err)
	}
	d.drop(seg)
	return deltas, nil
}

func (d *Dir) drop(seg segment) {
	d.mu.Lock()
	d.segs = slices.DeleteFunc(d.segs, func(s segment) bool { return s.name == seg.name })
	d.used -= seg.size
	d.mu.Unlock()
}

func read(path string, topics int) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("spill: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 256<<10)
	deltas := make(map[string]int64, topics)
	var topic []byte
	for {
		n, err := binary.ReadUvarint(r)
		if err == io.EOF {
			return deltas, nil
		}
		if err != nil || n > math.MaxUint16 {
			return nil, fmt.Errorf("%w: %s: bad topic length", ErrCorrupt, path)
		}
		topic = slices.Grow(topic[:0], int(n))[:n]
		if _, err := io.ReadFull(r, topic); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
		}
		delta, err := binary.ReadUvarint(r)
		if err != nil || delta > math.MaxInt64 {
			return nil, fmt.Errorf("%w: %s: bad delta", ErrCorrupt, path)
		}
		deltas[string(topic)] = int64(delta) // a segment is a map: each topic once
	}
}
