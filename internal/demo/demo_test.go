package demo_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/demo"
	"github.com/hotcount/hotcount/internal/testenv"
)

// TestDemo runs short races: one key is held at its ceiling, two shards lift
// it about twofold, and coalescing lifts it far beyond; the chart is SVG.
func TestDemo(t *testing.T) {
	d := testenv.StartDynalite(t)
	testenv.AWSEnv(t)
	cfg := demo.Config{Endpoint: d.Endpoint, Table: "demo", Ceiling: 50, Shards: []int{1, 2}, Writers: 8,
		Duration: time.Second, FlushInterval: 100 * time.Millisecond}
	res, err := demo.Run(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d results, want 4", len(res))
	}
	direct1, coalesced1, direct2 := res[0], res[1], res[2]
	// The emulator's bucket: the ceiling plus its burst (ceiling / 10) over one second.
	if limit := 1.1 * (cfg.Ceiling + cfg.Ceiling/10); direct1.Mentions > limit {
		t.Errorf("N=1 direct: %.0f mentions/s past the ceiling %.0f", direct1.Mentions, cfg.Ceiling)
	}
	if direct1.Throttled == 0 {
		t.Error("N=1 direct: nothing throttled: the race did not reach the ceiling")
	}
	if direct2.Mentions < 1.5*direct1.Mentions {
		t.Errorf("two shards accepted %.0f/s against one's %.0f/s: want about twice", direct2.Mentions, direct1.Mentions)
	}
	if coalesced1.Mentions < 10*direct1.Mentions || coalesced1.Throttled != 0 {
		t.Errorf("coalesced: %.0f mentions/s, %d throttled; want far above direct's %.0f and none throttled",
			coalesced1.Mentions, coalesced1.Throttled, direct1.Mentions)
	}
	var svg bytes.Buffer
	if err := demo.WriteSVG(&svg, cfg, res); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&svg)
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the chart is not well-formed XML: %v", err)
		}
	}
}
