package ingest

import (
	"math/rand/v2"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// settles is a message that only records how it was settled.
type settles struct {
	jetstream.Msg
	acked, naked int
}

func (m *settles) Ack() error { m.acked++; return nil }
func (m *settles) Nak() error { m.naked++; return nil }

// TestLaneTellsDeliveriesApart: a partition lane counts a message the
// first time; drops a second delivery of one it still holds (the held
// one's ack settles both); acknowledges uncounted one it has dealt with
// (a consumer's new leader whose state lagged delivers those again, with
// a delivery count of 1); counts again one it handed back; and counts one
// below those it dealt with that it never saw (delivered to another
// sidecar while the pin moved).
func TestLaneTellsDeliveriesApart(t *testing.T) {
	var l lane
	if got := l.seen(5); got != fresh {
		t.Fatalf("first delivery of 5: %v, want fresh", got)
	}
	m5 := &settles{}
	a5 := l.hold(m5, 5)
	if got := l.seen(5); got != holding {
		t.Fatalf("5 again while held: %v, want holding", got)
	}
	l.done(6) // acknowledged uncounted, or refused
	if got := l.seen(6); got != settled {
		t.Fatalf("6 again after it was dealt with: %v, want settled", got)
	}
	if err := a5.Ack(); err != nil || m5.acked != 1 {
		t.Fatalf("Ack through the lane: %v, acked %d", err, m5.acked)
	}
	if got := l.seen(5); got != settled {
		t.Fatalf("5 again after its ack: %v, want settled", got)
	}
	if got := l.seen(3); got != fresh {
		t.Fatalf("3, never seen here: %v, want fresh", got)
	}
	m7 := &settles{}
	a7 := l.hold(m7, 7)
	if err := a7.Nak(); err != nil || m7.naked != 1 {
		t.Fatalf("Nak through the lane: %v, naked %d", err, m7.naked)
	}
	if got := l.seen(7); got != fresh {
		t.Fatalf("7 again after it was handed back: %v, want fresh (counted again)", got)
	}
	if l.suspicious() {
		t.Fatal("a lane never claimed is suspicious")
	}
	l.suspect()
	if !l.suspicious() {
		t.Fatal("a lane just claimed is not suspicious: its first deliveries would skip the journal")
	}
}

// TestRangesForgetTheOldest: past maxRanges the lowest ranges go, so a
// hole closed never copies more than maxRanges.
func TestRangesForgetTheOldest(t *testing.T) {
	var rs ranges
	for seq := uint64(1); seq <= 2*maxRanges; seq++ {
		rs.add(2 * seq) // every other: one range each
	}
	if len(rs) != maxRanges || rs.has(2) || !rs.has(4*maxRanges) {
		t.Fatalf("%d ranges, has(2) %v, has(%d) %v; want %d, the lowest forgotten", len(rs), rs.has(2), 4*maxRanges, rs.has(4*maxRanges), maxRanges)
	}
}

// TestRangesHoldWhatWasAdded: added in any order, the set holds exactly
// what was added, merged into as few ranges as it makes.
func TestRangesHoldWhatWasAdded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var rs ranges
	in := map[uint64]bool{}
	for range 2000 {
		seq := uint64(rng.IntN(500))
		rs.add(seq)
		in[seq] = true
	}
	for seq := uint64(0); seq < 510; seq++ {
		if rs.has(seq) != in[seq] {
			t.Fatalf("has(%d) = %v, added %v", seq, rs.has(seq), in[seq])
		}
	}
	for i := 1; i < len(rs); i++ {
		if rs[i-1][1]+1 >= rs[i][0] {
			t.Fatalf("ranges %v and %v touch: not merged", rs[i-1], rs[i])
		}
	}
	var all ranges
	for seq := uint64(100); seq > 0; seq-- {
		all.add(seq)
	}
	if len(all) != 1 || all[0] != [2]uint64{1, 100} {
		t.Fatalf("1..100 added backwards: %v, want one range", all)
	}
}
