package durable

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// BenchmarkWindowAdd is a reader's add of one mention: 1,000 Zipf
// topics' Fresh counters in one stream, drained every 65,536 adds (about
// a second of BenchmarkCounters' pace at the default flush interval).
func BenchmarkWindowAdd(b *testing.B) {
	topics := make([]string, 1000)
	for i := range topics {
		topics[i] = "topic-" + strconv.Itoa(i)
	}
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, uint64(len(topics)-1))
	seq := make([]schema.Counter, 1<<16)
	for i := range seq {
		seq[i] = freshOf(topics[z.Uint64()], 29_000_000)
	}
	w := newWindow()
	s := stream{p: 3, name: "MENTIONS-3", epoch: 1_700_000_000_000_000}
	now := time.Now()
	b.ReportAllocs()
	for i := range b.N {
		if i%len(seq) == 0 && i > 0 {
			w.drain()
		}
		w.add(s, uint64(i+1), 1, now, seq[i%len(seq)])
	}
}
