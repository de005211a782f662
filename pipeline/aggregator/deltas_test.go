package aggregator_test

import (
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/hotcount/hotcount/pipeline/aggregator"
)

// TestDeltasActsAsAMap: random sets, adds, deletes and lookups, with
// deletes while ranging, agree with a map at every step, through growth
// and rebuilds; names of every length, the empty one and ones past a
// two-byte length included.
func TestDeltasActsAsAMap(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	names := []string{"", "a", strings.Repeat("x", 5000), strings.Repeat("y", 70_000), "é"}
	for i := range 30_000 {
		names = append(names, "topic-"+strconv.Itoa(i))
	}
	d, m := aggregator.NewDeltas(0), map[string]int64{}
	check := func(step int) {
		t.Helper()
		if d.Len() != len(m) {
			t.Fatalf("step %d: Len %d, want %d", step, d.Len(), len(m))
		}
		if got := d.Map(); !maps.Equal(got, m) && len(m) > 0 {
			t.Fatalf("step %d: %d topics differ from the map's", step, len(got))
		}
	}
	for step := range 200_000 {
		name := names[r.IntN(len(names))]
		switch op := r.IntN(10); {
		case op < 4:
			v := r.Int64N(100)
			if isNew := d.Set(name, v); isNew == hasKey(m, name) {
				t.Fatalf("step %d: Set(%.10q) isNew = %v", step, name, isNew)
			}
			m[name] = v
		case op < 6:
			p, _ := d.Ref(name)
			*p += 3
			m[name] += 3
		case op < 8:
			d.Delete(name)
			delete(m, name)
		default:
			v, ok := d.Get(name)
			if w, wok := m[name]; v != w || ok != wok {
				t.Fatalf("step %d: Get(%.10q) = %d, %v; want %d, %v", step, name, v, ok, w, wok)
			}
		}
		if step%20_000 == 0 {
			check(step)
			// Delete every other topic while ranging, as the flusher does
			// with what it wrote.
			seen := 0
			for topic, v := range d.All() {
				if m[topic] != v {
					t.Fatalf("step %d: All yields %.10q = %d, want %d", step, topic, v, m[topic])
				}
				if seen++; seen%2 == 0 {
					d.Delete(topic)
					delete(m, topic)
				}
			}
			check(step)
		}
	}
	check(-1)
}

func hasKey(m map[string]int64, k string) bool { _, ok := m[k]; return ok }

// TestNilDeltasIsEmpty: a nil *Deltas reads as an empty map.
func TestNilDeltasIsEmpty(t *testing.T) {
	var d *aggregator.Deltas
	if _, ok := d.Get("x"); ok || d.Len() != 0 || d.Map() != nil {
		t.Fatal("nil Deltas is not empty")
	}
	for range d.All() {
		t.Fatal("nil Deltas yields")
	}
	d.Delete("x") // no panic
}
