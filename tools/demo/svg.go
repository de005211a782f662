package demo

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// WriteSVG draws the results: accepted mentions per second (log scale) for
// each shard count, direct and coalesced side by side, each bar labelled
// with its figure, and the partition ceiling N × Ceiling drawn over the bars
// with its value beside it.
//
// Its elements carry classes for tests and styling: "bar direct" and "bar
// coalesced" for the bars, "figure" for their labels, "ceiling" for the
// ceiling lines and their labels, "axis" for the axis title.
func WriteSVG(w io.Writer, cfg Config, results []Result) error {
	const (
		width, height            = 800, 430
		left, right, top, bottom = 80, 20, 66, 64
		red                      = "#c00"
	)
	base := float64(height - bottom) // the plot's bottom edge
	maxV := cfg.Ceiling
	for _, n := range cfg.Shards {
		maxV = math.Max(maxV, float64(n)*cfg.Ceiling)
	}
	for _, r := range results {
		maxV = math.Max(maxV, r.Mentions)
	}
	lo, hi := math.Floor(math.Log10(math.Max(cfg.Ceiling/10, 1))), math.Ceil(math.Log10(maxV))
	if hi <= lo {
		hi = lo + 1
	}
	// y is v's height on the log scale, clamped to the plot.
	y := func(v float64) float64 {
		e := math.Min(math.Max(math.Log10(math.Max(v, 1)), lo), hi)
		return base - (e-lo)/(hi-lo)*(base-top)
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15">One hot topic, %d writers: mentions accepted per second</text>`+"\n", left, cfg.Writers)
	fmt.Fprintf(&b, `<text x="%d" y="42" fill="#555">each key takes at most %.0f writes/s (DynamoDB's 1,000, scaled down); N shards are N keys</text>`+"\n", left, cfg.Ceiling)
	for e := lo; e <= hi; e++ {
		ty := y(math.Pow(10, e))
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, width-right, ty, ty, left-6, ty+4, compact(math.Pow(10, e)))
	}
	fmt.Fprintf(&b, `<text class="axis" transform="translate(22 %.1f) rotate(-90)" text-anchor="middle">accepted mentions/s (log scale)</text>`+"\n", (base+top)/2)

	group := float64(width-left-right) / float64(len(cfg.Shards))
	barW := group * 0.24
	x0 := func(i int) float64 { return float64(left) + group*float64(i) + group*0.05 }
	for i, n := range cfg.Shards {
		ceil := y(float64(n) * cfg.Ceiling)
		for _, r := range results {
			if r.Shards != n {
				continue
			}
			x, color := x0(i), "#888"
			if r.Coalesced {
				x, color = x0(i)+barW, "#2a7"
			}
			barTop := y(r.Mentions)
			fmt.Fprintf(&b, `<rect class="bar %s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>N = %d, %s: %.0f mentions/s, %.0f writes/s, %d throttled</title></rect>`+"\n",
				mode(r.Coalesced), x, barTop, barW-2, base-barTop, color, n, mode(r.Coalesced), r.Mentions, r.Writes, r.Throttled)
			// The figure goes above its bar; a bar that stops just under
			// the ceiling has it above the line instead, clear of it.
			labelY := barTop - 4
			if barTop > ceil && barTop-ceil < 16 {
				labelY = ceil - 4
			}
			fmt.Fprintf(&b, `<text class="figure" x="%.1f" y="%.1f" text-anchor="middle">%s/s</text>`+"\n", x+barW/2-1, labelY, compact(r.Mentions))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">N = %d</text>`+"\n", x0(i)+barW, base+18, n)
	}
	// The ceilings last, so that they are drawn over the bars, each with its
	// value to its right.
	for i, n := range cfg.Shards {
		ceil := y(float64(n) * cfg.Ceiling)
		fmt.Fprintf(&b, `<line class="ceiling" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="6 3"/>`+"\n",
			x0(i)-4, x0(i)+2*barW+2, ceil, ceil, red)
		fmt.Fprintf(&b, `<text class="ceiling" x="%.1f" y="%.1f" fill="%s" font-size="11">ceiling %s/s</text>`+"\n",
			x0(i)+2*barW+6, ceil+4, red, compact(float64(n)*cfg.Ceiling))
	}

	ly := height - 16
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="#888"/><text x="%d" y="%d">direct: one write per mention</text>`+"\n", left, ly-9, left+14, ly)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="#2a7"/><text x="%d" y="%d">coalesced by hotcount</text>`+"\n", left+210, ly-9, left+224, ly)
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="6 3"/><text x="%d" y="%d">partition ceiling: N × %.0f writes/s</text>`+"\n",
		left+370, left+394, ly-4, ly-4, red, left+400, ly, cfg.Ceiling)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// compact writes v with a k or M suffix and two or three significant
// digits: 103, 1.2k, 45k, 6.4M.
func compact(v float64) string {
	unit := ""
	switch {
	case v >= 1e6:
		v, unit = v/1e6, "M"
	case v >= 1e3:
		v, unit = v/1e3, "k"
	}
	digits := 0
	if unit != "" && v < 10 {
		digits = 1
	}
	s := strconv.FormatFloat(v, 'f', digits, 64)
	return strings.TrimSuffix(s, ".0") + unit
}
