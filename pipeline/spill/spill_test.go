package spill

import (
	"errors"
	"iter"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func window(from, n int, delta int64) deltas {
	w := make(deltas, n)
	for i := from; i < from+n; i++ {
		w["topic-"+strconv.Itoa(i)] = delta + int64(i)
	}
	return w
}

// TestPutTakeInOrder: segments come back whole, oldest first, and leave
// the folder empty.
func TestPutTakeInOrder(t *testing.T) {
	d, err := Open(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	a, b := window(0, 100, 1), window(100, 50, 1<<40)
	for _, w := range []deltas{a, b} {
		if err := d.Put(w); err != nil {
			t.Fatal(err)
		}
	}
	if used, segs := d.Stats(); segs != 2 || used != Size(a)+Size(b) {
		t.Fatalf("stats %d bytes %d segments, want %d and 2", used, segs, Size(a)+Size(b))
	}
	for i, want := range []deltas{a, b} {
		got, err := d.Take()
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("segment %d: got %d topics, want %d (or different deltas)", i, len(got), len(want))
		}
	}
	if got, err := d.Take(); got != nil || err != nil {
		t.Fatalf("empty folder gave %v, %v", got, err)
	}
	if used, segs := d.Stats(); used != 0 || segs != 0 {
		t.Fatalf("after taking all: %d bytes, %d segments", used, segs)
	}
}

// TestBudget: a segment past the budget is refused whole and the caller
// keeps it; room comes back when a segment is taken.
func TestBudget(t *testing.T) {
	w := window(0, 100, 1)
	d, err := Open(t.TempDir(), Size(w)*2)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := d.Put(w); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Put(w); !errors.Is(err, ErrFull) {
		t.Fatalf("third segment: %v, want ErrFull", err)
	}
	if _, segs := d.Stats(); segs != 2 {
		t.Fatalf("%d segments after a refused put, want 2", segs)
	}
	if _, err := d.Take(); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(w); err != nil {
		t.Fatalf("after a take: %v", err)
	}
}

// TestReopenRecovers: a new process on the folder gets back the segments
// an earlier one left, in order, and not the one it was writing when it
// died.
func TestReopenRecovers(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	a, b := window(0, 10, 1), window(10, 10, 2)
	if err := d.Put(a); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(b); err != nil {
		t.Fatal(err)
	}
	// A write cut off by a crash.
	if err := os.WriteFile(filepath.Join(dir, prefix+"00000000000000000099"+suffix+".tmp"), []byte{1, 2, 3}, 0o640); err != nil {
		t.Fatal(err)
	}
	d2, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if used, segs := d2.Stats(); segs != 2 || used != Size(a)+Size(b) {
		t.Fatalf("reopened: %d bytes %d segments, want %d and 2", used, segs, Size(a)+Size(b))
	}
	c := window(20, 5, 3)
	if err := d2.Put(c); err != nil { // numbered after the recovered ones
		t.Fatal(err)
	}
	for i, want := range []deltas{a, b, c} {
		got, err := d2.Take()
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("segment %d differs", i)
		}
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 0 {
		t.Fatalf("%d files left, want none", len(left))
	}
}

// TestCorruptSegment: a damaged segment is reported and moved aside, never
// half-read, and the segments behind it still come back.
func TestCorruptSegment(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, prefix+"00000000000000000001"+suffix), []byte{5, 'a', 'b'}, 0o640); err != nil {
		t.Fatal(err)
	}
	d, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	w := window(0, 3, 1)
	if err := d.Put(w); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Take(); !errors.Is(err, ErrCorrupt) || got != nil {
		t.Fatalf("corrupt segment gave %v, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, prefix+"00000000000000000001"+suffix+".bad")); err != nil {
		t.Fatalf("damaged segment not kept aside: %v", err)
	}
	if got, err := d.Take(); err != nil || !maps.Equal(got, w) {
		t.Fatalf("segment behind the damaged one: %v, %v", got, err)
	}
}

// deltas is a map as a segment's Deltas.
type deltas map[string]int64

func (d deltas) Len() int { return len(d) }
func (d deltas) All() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		for k, v := range d {
			if !yield(k, v) {
				return
			}
		}
	}
}
