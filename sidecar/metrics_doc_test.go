package sidecar_test

import (
	"os"
	"strings"
	"testing"

	"github.com/hotcount/hotcount/config"
)

// TestEveryMetricIsDocumented starts a sidecar in each NATS mode, with
// time buckets and shared totals on, and finds each hotcount_ metric it
// registers in docs/METRICS.md: an operator who sees a metric on
// /metrics finds what it means there (hotcount_dependency_up was once
// missing). A row may name its later metrics by their end, after a whole
// name with the same beginning (`hotcount_aggregator_buffered_topics`,
// `_buffered_mentions`), which counts too. A labelled metric shows only
// once it has a series: hotcount_trend_reads_total, before any windowed
// read, escapes it.
func TestEveryMetricIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(doc), "\n")
	documented := func(name string) bool {
		for _, l := range lines {
			if strings.Contains(l, "`"+name+"`") || strings.Contains(l, "`"+name+"{") {
				return true
			}
			// `hotcount_x_y`, `_z`: a row's later name by its end, after
			// a whole name with the same beginning.
			for i := len("hotcount_"); i < len(name); i++ {
				if name[i] == '_' && strings.Contains(l, "`"+name[:i+1]) &&
					(strings.Contains(l, "`"+name[i:]+"`") || strings.Contains(l, "`"+name[i:]+"{")) {
					return true
				}
			}
		}
		return false
	}
	for _, mode := range []string{config.ModeCore, config.ModeJetStream, config.ModePartitioned} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, func(c *config.Config) {
				c.NATSMode = mode
				c.ShareTotals = "true"
				if mode == config.ModePartitioned {
					c.Partitions = 2
				}
			})
			mfs, err := e.sc.Registry().Gather()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, mf := range mfs {
				name := mf.GetName()
				if !strings.HasPrefix(name, "hotcount_") {
					continue
				}
				n++
				if !documented(name) {
					t.Errorf("%s (%s) is not in docs/METRICS.md", name, mf.GetHelp())
				}
			}
			if n < 40 {
				t.Errorf("%d hotcount_ metrics registered: the sidecar's registry is not the one /metrics serves", n)
			}
			t.Logf("%d hotcount_ metrics, each in docs/METRICS.md", n)
		})
	}
}
