package demo_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/tools/demo"
)

// TestDemo runs short races against the dynalite StartDynalite starts, as
// make demo does: one key is held at its ceiling, two shards lift it about
// twofold, and coalescing lifts it far beyond; the chart labels every bar.
func TestDemo(t *testing.T) {
	testenv.AWSEnv(t)
	endpoint, stop, err := demo.StartDynalite(context.Background(), testenv.DynaliteBinary(t), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// 32 writers: each waits for its write, and two shards' 100 writes a
	// second need them to take under 320 ms (8 writers reached 68 a
	// second on a loaded machine, their writes slower than 80 ms).
	cfg := demo.Config{Endpoint: endpoint, Table: "demo", Ceiling: 50, Shards: []int{1, 2}, Writers: 32,
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
	checkChart(t, parseSVG(t, svg.Bytes()), len(res), []string{"ceiling 50/s", "ceiling 100/s"})
}

// TestStartDynaliteFails: a program that exits instead of listening is
// reported at once, not after the start timeout; a missing one, too.
func TestStartDynaliteFails(t *testing.T) {
	for _, tt := range []struct{ name, bin, want string }{
		// The test binary refuses dynalite's flags and exits.
		{"exits", os.Args[0], "exited before listening"},
		{"missing", "/nonexistent/dynalite", "start dynalite"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, _, err := demo.StartDynalite(context.Background(), tt.bin, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want one that says %q", err, tt.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %s to notice", d)
			}
		})
	}
}

// TestWriteSVG draws known results: each bar carries its figure, the axis
// its unit, and each ceiling line, drawn over the bars, its value; a bar at
// the ceiling reaches the line, and one off the bottom of the scale stays in
// the plot.
func TestWriteSVG(t *testing.T) {
	cfg := demo.Config{Ceiling: 100, Shards: []int{1, 2}, Writers: 16}
	res := []demo.Result{
		{Shards: 1, Mentions: 100},
		{Shards: 1, Coalesced: true, Mentions: 6_402_960},
		{Shards: 2, Mentions: 0}, // below the axis (ceiling / 10)
		{Shards: 2, Coalesced: true, Mentions: 45_210},
	}
	var b bytes.Buffer
	if err := demo.WriteSVG(&b, cfg, res); err != nil {
		t.Fatal(err)
	}
	els := parseSVG(t, b.Bytes())
	figures := checkChart(t, els, len(res), []string{"ceiling 100/s", "ceiling 200/s"})
	if want := []string{"100/s", "6.4M/s", "0/s", "45k/s"}; !slices.Equal(figures, want) {
		t.Errorf("figures %q, want %q", figures, want)
	}
	bar := els[slices.IndexFunc(els, func(e element) bool { return e.attr["class"] == "bar direct" })]
	line := els[slices.IndexFunc(els, func(e element) bool { return e.name == "line" && e.attr["class"] == "ceiling" })]
	if top, ceil := num(t, bar, "y"), num(t, line, "y1"); math.Abs(top-ceil) > 0.5 {
		t.Errorf("N=1 direct at the ceiling: bar top at y=%.1f, ceiling line at y=%.1f", top, ceil)
	}
}

// TestDocsChart: the committed docs/demo.svg, which README shows, is
// well-formed and has the current look (make demo's chart, copied).
func TestDocsChart(t *testing.T) {
	b, err := os.ReadFile("../../docs/demo.svg")
	if err != nil {
		t.Fatal(err)
	}
	checkChart(t, parseSVG(t, b), 8, []string{"ceiling 100/s", "ceiling 200/s", "ceiling 400/s", "ceiling 800/s"})
}

// element is one SVG element with its attributes and text.
type element struct {
	name string
	attr map[string]string
	text string
}

// parseSVG decodes svg strictly and returns its elements in document order.
func parseSVG(t *testing.T, svg []byte) []element {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var els []element
	var open []int
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the chart is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := element{name: tok.Name.Local, attr: map[string]string{}}
			for _, a := range tok.Attr {
				e.attr[a.Name.Local] = a.Value
			}
			open = append(open, len(els))
			els = append(els, e)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) > 0 {
				els[open[len(open)-1]].text += string(tok)
			}
		}
	}
	if len(els) == 0 || els[0].name != "svg" {
		t.Fatal("the chart is not an SVG")
	}
	return els
}

// checkChart asserts what a reader needs: bars bars, each with its figure
// above it, inside the plot; the axis title with the unit; the ceiling lines
// drawn after (over) every bar, with the labels wantCeilings. It returns
// the figures in order.
func checkChart(t *testing.T, els []element, bars int, wantCeilings []string) []string {
	t.Helper()
	var rects, figures []element
	var ceilings []string
	lastBar, firstLine, axis := -1, len(els), ""
	for i, e := range els {
		switch class := e.attr["class"]; {
		case strings.HasPrefix(class, "bar "):
			rects, lastBar = append(rects, e), i
		case class == "figure":
			figures = append(figures, e)
		case class == "ceiling" && e.name == "line":
			firstLine = min(firstLine, i)
		case class == "ceiling":
			ceilings = append(ceilings, e.text)
		case class == "axis":
			axis = e.text
		}
	}
	if !strings.Contains(axis, "mentions/s") {
		t.Errorf("axis title %q does not give the unit (mentions/s)", axis)
	}
	if len(rects) != bars || len(figures) != bars {
		t.Fatalf("%d bars and %d figures, want %d of each", len(rects), len(figures), bars)
	}
	var texts []string
	for i, r := range rects {
		f := figures[i]
		texts = append(texts, f.text)
		if !strings.HasSuffix(f.text, "/s") {
			t.Errorf("figure %q has no unit", f.text)
		}
		x, y, w, h := num(t, r, "x"), num(t, r, "y"), num(t, r, "width"), num(t, r, "height")
		if h < 0 || y < 0 {
			t.Errorf("bar %d: y %.1f, height %.1f: outside the plot", i, y, h)
		}
		if fx, fy := num(t, f, "x"), num(t, f, "y"); fx < x || fx > x+w || fy > y {
			t.Errorf("figure %q at (%.1f, %.1f) is not above its bar (x %.1f..%.1f, top %.1f)", f.text, fx, fy, x, x+w, y)
		}
	}
	if firstLine < lastBar {
		t.Error("a ceiling line is drawn before a bar, which would hide it")
	}
	if !slices.Equal(ceilings, wantCeilings) {
		t.Errorf("ceiling labels %q, want %q", ceilings, wantCeilings)
	}
	return texts
}

func num(t *testing.T, e element, attr string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(e.attr[attr], 64)
	if err != nil {
		t.Fatalf("<%s %s=%q>: %v", e.name, attr, e.attr[attr], err)
	}
	return v
}
