package aggregator

import (
	"encoding/binary"
	"hash/maphash"
	"iter"
	"math/bits"
	"unsafe"
)

// Deltas maps topics to deltas, like a map[string]int64, in about half the
// memory: a window of a million topics is what a store outage leaves in
// memory, and a Go map's slot (a 16-byte string header and the delta, at a
// load that swings between 44% and 88% as it grows) plus the garbage
// collector's headroom came to 169 B per topic (BenchmarkOutageRSS).
//
// A slot here is 16 bytes: a pointer to the name and the delta. Names are
// copied into shared, pointer-free chunks, each after its length (one byte
// below 255), so a topic costs its name's bytes plus one, not an
// allocation of its own,
// and holds nothing of the caller's (the ingest's topic is a slice of the
// NATS subject). A chunk lives while any slot points into it. A one-byte
// tag per slot, from the hash, lets a lookup skip most slots without
// reading their names. Lookups probe linearly; a deleted slot is marked, so
// deleting while ranging is safe, as it is for a map.
//
// The topics are spread over parts tables by their hash, each growing on
// its own: growing one table of millions of slots would hold the
// aggregator's lock (and the ingest) for a third of a second, a part's
// growth for a few milliseconds.
//
// The zero value is empty and ready to use. A nil *Deltas reads as empty.
// It is not safe for concurrent use.
type Deltas struct {
	parts  [parts]*table // nil until a topic hashes to it
	live   int           // names present, in every part
	seeded bool
	seed   maphash.Seed
	chunk  []byte            // where new names go
	long   map[string]*int64 // names too long for a two-byte length (none, under --max-topic-bytes)
}

// table is one part's open-addressing table.
type table struct {
	slots []slot
	tags  []uint8 // per slot: 0 empty, 1 deleted, else 2 + 7 bits of the hash
	live  int     // names present
	used  int     // slots not empty (live and deleted)
}

type slot struct {
	name  *byte // at the name's length, in a chunk
	delta int64
}

const (
	// parts is how many tables a Deltas spreads its topics over: a power
	// of two, chosen by the hash's top bits.
	parts      = 128
	partBits   = 7
	tagEmpty   = 0
	tagDeleted = 1
	minSlots   = 8
	// maxLoad is the share of slots in use (live or deleted) past which
	// a table grows by a fifth (or, mostly deleted, is rebuilt at its
	// size). Growing by a fifth, not doubling, keeps the load between 79%
	// and 95%: a table just past a doubling would be half empty, and a
	// window of a million topics is where memory matters. The tags keep
	// the long probes of a full table cheap: 64 to a cache line, and a
	// name is read only when its tag matches.
	maxLoadNum, maxLoadDen = 19, 20
	maxShort               = 1<<16 - 1
)

// NewDeltas returns an empty Deltas with room for about n topics.
func NewDeltas(n int) *Deltas {
	d := &Deltas{}
	if n > 0 {
		d.seeded, d.seed = true, maphash.MakeSeed()
		for i := range d.parts {
			d.parts[i] = newTable(n / parts)
		}
	}
	return d
}

func newTable(n int) *table {
	size := max(minSlots, n*maxLoadDen/maxLoadNum+1)
	return &table{slots: make([]slot, size), tags: make([]uint8, size)}
}

// Of a topic's hash: the top bits choose its part, the next its tag, and
// the rest its first slot in the part.
func partOf(h uint64) int  { return int(h >> (64 - partBits)) }
func tagOf(h uint64) uint8 { return 2 + uint8(h>>(64-2*partBits))&(1<<partBits-1) }

// home is the first slot of hash h in t: the hash's low bits scaled to the
// table's size (a multiply, not a modulo: sizes are not powers of two).
func (t *table) home(h uint64) int {
	hi, _ := bits.Mul64(h<<(2*partBits), uint64(len(t.slots)))
	return int(hi)
}

// next is the slot after i, wrapping around.
func (t *table) next(i int) int {
	if i++; i == len(t.slots) {
		return 0
	}
	return i
}

// Len is the number of topics.
func (d *Deltas) Len() int {
	if d == nil {
		return 0
	}
	return d.live + len(d.long)
}

// Get returns topic's delta and whether topic is present.
func (d *Deltas) Get(topic string) (int64, bool) {
	if d == nil {
		return 0, false
	}
	if len(topic) > maxShort {
		if p, ok := d.long[topic]; ok {
			return *p, true
		}
		return 0, false
	}
	if !d.seeded {
		return 0, false
	}
	h := maphash.String(d.seed, topic)
	t := d.parts[partOf(h)]
	if t == nil {
		return 0, false
	}
	if i, ok := t.find(topic, h); ok {
		return t.slots[i].delta, true
	}
	return 0, false
}

// Set sets topic's delta, copying the name in if topic is new, and reports
// whether it was.
func (d *Deltas) Set(topic string, delta int64) (isNew bool) {
	p, isNew := d.Ref(topic)
	*p = delta
	return isNew
}

// Ref returns where topic's delta is kept, adding topic with delta 0 (its
// name copied in) if it is new, and whether it was: one lookup where a Get
// and a Set would make two. The pointer is good until the next Set, Ref or
// Delete.
func (d *Deltas) Ref(topic string) (delta *int64, isNew bool) {
	if len(topic) > maxShort {
		if d.long == nil {
			d.long = make(map[string]*int64)
		}
		if p, ok := d.long[topic]; ok {
			return p, false
		}
		p := new(int64)
		d.long[topic] = p
		return p, true
	}
	if !d.seeded {
		d.seeded, d.seed = true, maphash.MakeSeed()
	}
	h := maphash.String(d.seed, topic)
	t := d.parts[partOf(h)]
	if t == nil {
		t = newTable(0)
		d.parts[partOf(h)] = t
	}
	if i, ok := t.find(topic, h); ok {
		return &t.slots[i].delta, false
	}
	if (t.used+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.grow(d.seed)
	}
	i := t.free(h)
	if t.tags[i] == tagEmpty {
		t.used++
	}
	t.tags[i] = tagOf(h)
	t.slots[i] = slot{name: d.intern(topic)}
	t.live++
	d.live++
	return &t.slots[i].delta, true
}

// Delete removes topic, if present.
func (d *Deltas) Delete(topic string) {
	if d == nil {
		return
	}
	if len(topic) > maxShort {
		delete(d.long, topic)
		return
	}
	if !d.seeded {
		return
	}
	h := maphash.String(d.seed, topic)
	t := d.parts[partOf(h)]
	if t == nil {
		return
	}
	if i, ok := t.find(topic, h); ok {
		t.tags[i] = tagDeleted
		t.slots[i] = slot{}
		t.live--
		d.live--
	}
}

// All yields every topic and its delta, in no set order. The loop may
// Delete topics and Set topics already present, as with a map, but must not
// Set new ones.
func (d *Deltas) All() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		if d == nil {
			return
		}
		for _, t := range d.parts {
			if t == nil {
				continue
			}
			for i := range t.slots {
				if t.tags[i] < 2 {
					continue
				}
				if !yield(nameOf(t.slots[i].name), t.slots[i].delta) {
					return
				}
			}
		}
		for topic, p := range d.long {
			if !yield(topic, *p) {
				return
			}
		}
	}
}

// find returns the slot holding topic.
func (t *table) find(topic string, h uint64) (int, bool) {
	tag := tagOf(h)
	for i := t.home(h); ; i = t.next(i) {
		switch t.tags[i] {
		case tagEmpty:
			return 0, false
		case tag:
			if nameOf(t.slots[i].name) == topic {
				return i, true
			}
		}
	}
}

// free returns the first slot a new name of hash h may take: empty or
// deleted.
func (t *table) free(h uint64) int {
	for i := t.home(h); ; i = t.next(i) {
		if t.tags[i] < 2 {
			return i
		}
	}
}

// grow enlarges the table by a fifth, or rebuilds it at its size if most
// of what is in use is deleted slots.
func (t *table) grow(seed maphash.Seed) {
	n := len(t.slots)
	if t.live*2 >= n*maxLoadNum/maxLoadDen {
		n += n / 5
	}
	old, oldTags := t.slots, t.tags
	t.slots, t.tags, t.used = make([]slot, n), make([]uint8, n), t.live
	for i, s := range old {
		if oldTags[i] < 2 {
			continue
		}
		j := t.home(maphash.String(seed, nameOf(s.name)))
		for t.tags[j] != tagEmpty {
			j = t.next(j)
		}
		t.slots[j], t.tags[j] = s, oldTags[i]
	}
}

// chunkSize is the size of a names chunk. Names longer than a sixteenth of
// it get an allocation of their own, so that a chunk is never mostly waste.
const chunkSize = 64 << 10

// intern copies topic, after its length, into the current chunk. The
// length is one byte, or for names of 255 bytes and more, 255 and then two
// bytes.
func (d *Deltas) intern(topic string) *byte {
	need := 1 + len(topic)
	if len(topic) >= 255 {
		need += 2
	}
	if need > chunkSize/16 {
		return &appendName(make([]byte, 0, need), topic)[0]
	}
	if cap(d.chunk)-len(d.chunk) < need {
		d.chunk = make([]byte, 0, chunkSize)
	}
	start := len(d.chunk)
	d.chunk = appendName(d.chunk, topic)
	return &d.chunk[start]
}

func appendName(b []byte, topic string) []byte {
	if len(topic) < 255 {
		b = append(b, byte(len(topic)))
	} else {
		b = binary.BigEndian.AppendUint16(append(b, 255), uint16(len(topic)))
	}
	return append(b, topic...)
}

// nameOf is the name interned at p.
func nameOf(p *byte) string {
	n, at := int(*p), 1
	if n == 255 {
		n = int(*(*byte)(unsafe.Add(unsafe.Pointer(p), 1)))<<8 | int(*(*byte)(unsafe.Add(unsafe.Pointer(p), 2)))
		at = 3
	}
	if n == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(p), at)), n)
}

// DeltasOf returns a Deltas holding m's topics and deltas.
func DeltasOf(m map[string]int64) *Deltas {
	d := NewDeltas(len(m))
	for topic, v := range m {
		d.Set(topic, v)
	}
	return d
}

// Map returns d's topics and deltas as a map (nil for an empty d): for
// tests and logs, not for windows, which it would double.
func (d *Deltas) Map() map[string]int64 {
	if d.Len() == 0 {
		return nil
	}
	m := make(map[string]int64, d.Len())
	for topic, v := range d.All() {
		m[topic] = v
	}
	return m
}
