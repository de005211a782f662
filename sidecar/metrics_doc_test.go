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
// missing). The table names a family's later members by their end
// (`hotcount_aggregator_buffered_topics`, `_buffered_mentions`), which
// counts too.
func TestEveryMetricIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := func(name string) bool {
		if strings.Contains(string(doc), "`"+name+"`") || strings.Contains(string(doc), "`"+name+"{") {
			return true
		}
		for i := range len(name) {
			if name[i] == '_' && i > len("hotcount") {
				end := name[i+1:]
				if strings.Contains(string(doc), "`_"+end+"`") || strings.Contains(string(doc), "`"+end+"`") || strings.Contains(string(doc), "`_"+end+"{") {
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
