package deploy_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/pipeline/ingest"
)

// The operator pack in observability/: the alerting rules (rules.yaml, and
// the same groups as a PrometheusRule), the Grafana dashboard and the
// PodMonitor, with the kustomization that applies the three (its
// rendering is what the PrometheusRule and PodMonitor tests read).
const (
	obsDir       = "observability"
	obsRules     = obsDir + "/rules.yaml"
	obsDashboard = obsDir + "/dashboard.json"
)

// targetLabels are the labels a scrape adds to every series (Prometheus's
// job and instance; the Prometheus Operator's namespace, pod, container,
// endpoint and service): queries may select on them whatever the metric.
var targetLabels = map[string]bool{
	"job": true, "instance": true, "namespace": true, "pod": true,
	"container": true, "endpoint": true, "service": true,
}

// series is what a running hotcount exposes under one name: its label
// names and, for each, the values seen.
type series map[string]map[string]bool

// exposedMetrics starts real sidecars (core mode, then JetStream mode:
// between them they register every metric; the embedded store; an
// in-process NATS server) and gathers their registries: the names /metrics
// serves, with the histogram and summary suffixes Prometheus stores, and
// the labels of each. Every labelled metric of hotcount is pre-initialised
// with all its label values, so the values are complete.
func exposedMetrics(t *testing.T) map[string]series {
	t.Helper()
	ns := testenv.NATS(t)
	cfg := config.Default()
	cfg.NATSURL, cfg.NATSMode = ns.ClientURL(), config.ModeJetStream
	cfg.Store, cfg.DataDir = config.StoreBolt, t.TempDir()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.EnsureStream(context.Background(), testenv.Connect(t, ns.ClientURL()), cfg.Stream, cfg.Subject, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Both kinds of write stage, one after the other: each exposes
	// metrics of its own (core mode's aggregator and flusher, the durable
	// engine's).
	var families []*dto.MetricFamily
	for _, mode := range []string{config.ModeCore, config.ModeJetStream} {
		cfg.NATSMode = mode
		sc := sidecartest.Run(t, cfg, nil)
		fs, err := sc.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		if err := sc.Stop(); err != nil {
			t.Fatalf("sidecar: %v", err)
		}
		families = append(families, fs...)
	}

	out := map[string]series{}
	add := func(name string, m *dto.Metric, extra string) {
		s := out[name]
		if s == nil {
			s = series{}
			out[name] = s
		}
		for _, lp := range m.GetLabel() {
			if s[lp.GetName()] == nil {
				s[lp.GetName()] = map[string]bool{}
			}
			s[lp.GetName()][lp.GetValue()] = true
		}
		if extra != "" && s[extra] == nil {
			s[extra] = map[string]bool{}
		}
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				add(f.GetName()+"_bucket", m, "le")
				add(f.GetName()+"_sum", m, "")
				add(f.GetName()+"_count", m, "")
			case dto.MetricType_SUMMARY:
				add(f.GetName(), m, "quantile")
				add(f.GetName()+"_sum", m, "")
				add(f.GetName()+"_count", m, "")
			default:
				add(f.GetName(), m, "")
			}
		}
	}
	t.Logf("a running sidecar exposes %d series names", len(out))
	// Sanity: the collectors the dashboard leans on are there.
	for _, name := range []string{"hotcount_ingest_events_total", "hotcount_dependency_up", "go_gc_gomemlimit_bytes", "process_resident_memory_bytes"} {
		if out[name] == nil {
			t.Fatalf("the sidecar does not expose %s: the gathering is broken", name)
		}
	}
	return out
}

// loadRules parses rules.yaml as Prometheus does (unknown fields fail,
// every expression and template is checked).
func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(obsRules, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("rules.yaml: %v", err)
	}
	if rgs == nil || len(rgs.Groups) == 0 {
		t.Fatal("rules.yaml: no rule groups")
	}
	return rgs
}

// renderedObjects renders dir with Kustomize and returns each object's
// kind, name and YAML.
func renderedObjects(t *testing.T, dir string) []renderedObject {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []renderedObject
	for _, r := range rm.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, renderedObject{kind: r.GetKind(), name: r.GetName(), doc: doc})
	}
	return out
}

type renderedObject struct {
	kind, name string
	doc        []byte
}

// strictInto decodes o into v, failing on any field v's type does not
// have (a misspelt field of a CRD).
func (o renderedObject) strictInto(t *testing.T, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(o.doc, v); err != nil {
		t.Fatalf("%s %s does not decode strictly: %v", o.kind, o.name, err)
	}
}

// operatorPack renders observability/ and decodes its objects strictly
// into the Prometheus Operator's and Kubernetes' types.
func operatorPack(t *testing.T) (monitoringv1.PodMonitor, monitoringv1.PrometheusRule, corev1.ConfigMap) {
	t.Helper()
	var (
		pm    monitoringv1.PodMonitor
		pr    monitoringv1.PrometheusRule
		cm    corev1.ConfigMap
		kinds []string
	)
	for _, o := range renderedObjects(t, obsDir) {
		kinds = append(kinds, o.kind)
		switch o.kind {
		case "PodMonitor":
			o.strictInto(t, &pm)
		case "PrometheusRule":
			o.strictInto(t, &pr)
		case "ConfigMap":
			o.strictInto(t, &cm)
		default:
			t.Errorf("unexpected kind %s in %s", o.kind, obsDir)
		}
	}
	slices.Sort(kinds)
	if !slices.Equal(kinds, []string{"ConfigMap", "PodMonitor", "PrometheusRule"}) {
		t.Fatalf("%s renders %v, want one ConfigMap, PodMonitor and PrometheusRule", obsDir, kinds)
	}
	return pm, pr, cm
}

// TestObservabilityRules: rules.yaml loads as Prometheus loads it, with no
// error; every alert carries a severity, a summary, a description and a
// runbook that names an existing document and heading; the
// PrometheusRule's groups are rules.yaml's.
func TestObservabilityRules(t *testing.T) {
	rgs := loadRules(t)
	alerts := 0
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			if err := checkRunbook(r.Annotations["runbook"]); err != nil {
				t.Errorf("%s: runbook: %v", r.Alert, err)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("rules.yaml has no alerts")
	}

	// The PrometheusRule, as rendered by the kustomization and decoded
	// into the operator's type, against rules.yaml.
	_, pr, _ := operatorPack(t)
	type rule struct {
		Record, Alert, Expr string
		For, KeepFiringFor  model.Duration
		Labels, Annotations map[string]string
	}
	type group struct {
		Name     string
		Interval model.Duration
		Rules    []rule
	}
	dur := func(s string) model.Duration {
		if s == "" {
			return 0
		}
		d, err := model.ParseDuration(s)
		if err != nil {
			t.Errorf("PrometheusRule: duration %q: %v", s, err)
		}
		return d
	}
	var want, got []group
	for _, g := range rgs.Groups {
		if g.QueryOffset != nil || g.Limit != 0 || len(g.Labels) > 0 {
			t.Errorf("group %s: query_offset, limit and labels are not compared here; compare them before using them", g.Name)
		}
		wg := group{Name: g.Name, Interval: g.Interval}
		for _, r := range g.Rules {
			wg.Rules = append(wg.Rules, rule{r.Record, r.Alert, r.Expr, r.For, r.KeepFiringFor, r.Labels, r.Annotations})
		}
		want = append(want, wg)
	}
	for _, g := range pr.Spec.Groups {
		gg := group{Name: g.Name}
		if g.Interval != nil {
			gg.Interval = dur(string(*g.Interval))
		}
		if g.QueryOffset != nil || g.Limit != nil || len(g.Labels) > 0 || g.PartialResponseStrategy != "" {
			t.Errorf("PrometheusRule group %s has settings rules.yaml lacks", g.Name)
		}
		for _, r := range g.Rules {
			gr := rule{Record: r.Record, Alert: r.Alert, Expr: r.Expr.String(), Labels: r.Labels, Annotations: r.Annotations}
			if r.For != nil {
				gr.For = dur(string(*r.For))
			}
			if r.KeepFiringFor != nil {
				gr.KeepFiringFor = dur(string(*r.KeepFiringFor))
			}
			gg.Rules = append(gg.Rules, gr)
		}
		got = append(got, gg)
	}
	if !reflect.DeepEqual(got, want) {
		for i := range max(len(got), len(want)) {
			var g, w group
			if i < len(got) {
				g = got[i]
			}
			if i < len(want) {
				w = want[i]
			}
			if g.Name != w.Name || g.Interval != w.Interval || len(g.Rules) != len(w.Rules) {
				t.Errorf("group %d: prometheusrule.yaml has %s (interval %s, %d rules), rules.yaml %s (interval %s, %d rules)",
					i, g.Name, g.Interval, len(g.Rules), w.Name, w.Interval, len(w.Rules))
				continue
			}
			for j := range g.Rules {
				if !reflect.DeepEqual(g.Rules[j], w.Rules[j]) {
					t.Errorf("group %s rule %d differs:\nprometheusrule.yaml: %+v\nrules.yaml:          %+v", g.Name, j, g.Rules[j], w.Rules[j])
				}
			}
		}
		t.Fatal("prometheusrule.yaml's spec.groups differ from rules.yaml's groups: copy them over")
	}
}

// headingSlug is GitHub's anchor for a Markdown heading.
func headingSlug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// checkRunbook checks that a runbook hint (a path from the repository
// root, with an optional #anchor) names a document that exists and, with
// an anchor, one of its headings.
func checkRunbook(hint string) error {
	path, anchor, _ := strings.Cut(hint, "#")
	b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(path)))
	if err != nil {
		return err
	}
	if anchor == "" {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok && headingSlug(strings.TrimLeft(h, "#")) == anchor {
			return nil
		}
	}
	return fmt.Errorf("%s has no heading #%s", path, anchor)
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasourceRef  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(obsDashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// grafanaVar matches a Grafana variable reference: $name, ${name},
// ${name:format} or [[name]].
var grafanaVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// varSentinel stands for a dashboard variable's value in a parsed query.
const varSentinel = "__grafana_variable__"

// expandVars replaces Grafana's interval variables with a duration and the
// dashboard's own variables with varSentinel, so that the query parses as
// PromQL; a variable the dashboard does not define is an error.
func expandVars(expr string, defined map[string]bool) (string, error) {
	var err error
	out := grafanaVar.ReplaceAllStringFunc(expr, func(m string) string {
		sub := grafanaVar.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		switch {
		case name == "__rate_interval" || name == "__interval" || name == "__range":
			return "5m"
		case defined[name]:
			return varSentinel
		}
		err = fmt.Errorf("undefined variable %s", m)
		return m
	})
	return out, err
}

// dashboardQueries returns every PromQL expression of the dashboard: each
// panel target's, and each query variable's label_values selector, with
// the variables expanded. It checks what makes the dashboard import and
// render: a schema version, a Prometheus datasource variable, a
// datasource on every panel and target, a query on every panel, unique
// panel ids.
func dashboardQueries(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 30 {
		t.Errorf("title %q, uid %q, schemaVersion %d: want a title, a uid and a current schema", d.Title, d.UID, d.SchemaVersion)
	}
	defined := map[string]bool{}
	dsVar := ""
	for _, v := range d.Templating.List {
		defined[v.Name] = true
		if v.Type == "datasource" {
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil || q != "prometheus" {
				t.Errorf("datasource variable %s queries %s, want prometheus", v.Name, v.Query)
			}
			dsVar = v.Name
		}
	}
	if dsVar == "" {
		t.Fatal("no datasource variable: the dashboard would be bound to one Grafana's datasource")
	}
	wantDS := datasourceRef{Type: "prometheus", UID: "${" + dsVar + "}"}
	for _, name := range []string{"job", "namespace", "pod"} {
		if !defined[name] {
			t.Errorf("no %s variable", name)
		}
	}

	queries := map[string]string{}
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		if v.Datasource == nil || *v.Datasource != wantDS {
			t.Errorf("variable %s: datasource %+v, want %+v", v.Name, v.Datasource, wantDS)
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query %s is not a string", v.Name, v.Query)
			continue
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, q)
			continue
		}
		expr, err := expandVars(m[1], defined)
		if err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
		}
		// The label it lists must be one the selected series carry.
		queries["variable "+v.Name] = fmt.Sprintf("sum by (%s) (%s)", m[2], expr)
	}

	ids := map[int]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource == nil || *p.Datasource != wantDS {
				t.Errorf("panel %q: datasource %+v, want %+v", p.Title, p.Datasource, wantDS)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no target", p.Title)
			}
			for _, tg := range p.Targets {
				where := fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID)
				if tg.Datasource == nil || *tg.Datasource != wantDS {
					t.Errorf("%s: datasource %+v, want %+v", where, tg.Datasource, wantDS)
				}
				if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
					t.Errorf("%s: no expression or refId", where)
					continue
				}
				expr, err := expandVars(tg.Expr, defined)
				if err != nil {
					t.Errorf("%s: %v", where, err)
				}
				if _, dup := queries[where]; dup {
					t.Errorf("%s: refId used twice", where)
				}
				queries[where] = expr
			}
		}
	}
	walk(d.Panels)
	return queries
}

// TestObservabilityDashboard: the dashboard is valid JSON that Grafana
// imports (a schema version, a Prometheus datasource variable, job,
// namespace and pod variables), every panel has a datasource and a query,
// every query uses only variables the dashboard defines, multi-valued
// variables through regular-expression matchers, and it fits in the
// ConfigMap the kustomization makes of it.
func TestObservabilityDashboard(t *testing.T) {
	d := loadDashboard(t)
	p := parser.NewParser(parser.Options{})
	for where, q := range dashboardQueries(t, d) {
		expr, err := p.ParseExpr(q)
		if err != nil {
			t.Errorf("%s: %q: %v", where, q, err)
			continue
		}
		for _, ms := range parser.ExtractSelectors(expr) {
			for _, m := range ms {
				if strings.Contains(m.Value, varSentinel) && m.Type != labels.MatchRegexp && m.Type != labels.MatchNotRegexp {
					t.Errorf("%s: %s: a multi-value variable needs =~", where, m)
				}
			}
		}
	}

	// kubectl apply (client-side) keeps the object in an annotation of at
	// most 256 KiB; the ConfigMap must carry the file unchanged.
	b, err := os.ReadFile(obsDashboard)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 200<<10 {
		t.Errorf("dashboard.json is %d bytes: too large for a ConfigMap applied client-side", len(b))
	}
	_, _, cm := operatorPack(t)
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v: Grafana's sidecar looks for grafana_dashboard: \"1\"", cm.Labels)
	}
	if len(cm.Data) != 1 || !json.Valid([]byte(cm.Data["hotcount.json"])) || cm.Data["hotcount.json"] != string(b) {
		t.Errorf("the dashboard ConfigMap does not carry dashboard.json as hotcount.json (keys %v)", slices.Collect(maps.Keys(cm.Data)))
	}
}

// TestObservabilityMetricNames: every expression of the rules and the
// dashboard parses as PromQL, and names only metrics a running hotcount
// exposes (or a series the rules record), with only the labels they carry
// (or the scrape's target labels), and only label values they take. A
// renamed metric, label or label value fails here, not on a dashboard.
func TestObservabilityMetricNames(t *testing.T) {
	exposed := exposedMetrics(t)
	rgs := loadRules(t)

	recorded := map[string]bool{}
	queries := map[string]string{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
				queries["record "+r.Record] = r.Expr
			} else {
				queries["alert "+r.Alert] = r.Expr
			}
		}
	}
	maps.Copy(queries, dashboardQueries(t, loadDashboard(t)))

	// labelsOf returns the labels the series e selects may carry.
	labelsOf := func(e parser.Expr) map[string]bool {
		out := maps.Clone(targetLabels)
		for _, ms := range parser.ExtractSelectors(e) {
			for _, m := range ms {
				if m.Name == model.MetricNameLabel {
					for l := range exposed[m.Value] {
						out[l] = true
					}
				}
			}
		}
		return out
	}

	p := parser.NewParser(parser.Options{})
	for _, where := range slices.Sorted(maps.Keys(queries)) {
		q := queries[where]
		expr, err := p.ParseExpr(q)
		if err != nil {
			t.Errorf("%s: %q: %v", where, q, err)
			continue
		}
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			switch n := node.(type) {
			case *parser.VectorSelector:
				checkSelector(t, where, n, exposed, recorded)
			case *parser.AggregateExpr:
				// by (...) / without (...): labels the aggregated series carry.
				have := labelsOf(n.Expr)
				for _, l := range n.Grouping {
					if !have[l] {
						t.Errorf("%s: %s groups by %q, which none of its series carries", where, n.Op, l)
					}
				}
			case *parser.BinaryExpr:
				if n.VectorMatching == nil {
					break
				}
				have := labelsOf(n.LHS)
				maps.Copy(have, labelsOf(n.RHS))
				for _, l := range n.VectorMatching.MatchingLabels {
					if !have[l] {
						t.Errorf("%s: matching on %q, which neither side carries", where, l)
					}
				}
			}
			return nil
		})
	}
}

// checkSelector checks one vector selector against what hotcount exposes.
func checkSelector(t *testing.T, where string, vs *parser.VectorSelector, exposed map[string]series, recorded map[string]bool) {
	t.Helper()
	name := vs.Name
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
			name = m.Value
		}
	}
	switch {
	case name == "":
		t.Errorf("%s: %s selects no metric by name", where, vs)
		return
	case recorded[name]:
		return // a series the rules record: its labels are its rule's
	case exposed[name] == nil:
		t.Errorf("%s: %s is not a metric hotcount exposes", where, name)
		return
	}
	s := exposed[name]
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel || targetLabels[m.Name] {
			continue
		}
		values, ok := s[m.Name]
		switch {
		case !ok:
			t.Errorf("%s: %s has no label %q (it has %v)", where, name, m.Name, slices.Sorted(maps.Keys(s)))
		case m.Type == labels.MatchEqual && !values[m.Value] && !strings.Contains(m.Value, varSentinel):
			t.Errorf("%s: %s{%s} never takes the value %q (it takes %v)", where, name, m.Name, m.Value, slices.Sorted(maps.Keys(values)))
		}
	}
}

// TestObservabilityPodMonitor: the PodMonitor selects the pods of the
// sidecar base (and of its overlay) and of the standalone pool, keeps the
// hotcount container of each and not the app's, and scrapes a port that
// container declares, on the path and port the pods' own annotations
// announce.
func TestObservabilityPodMonitor(t *testing.T) {
	pm, _, _ := operatorPack(t)
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatalf("PodMonitor selector: %v", err)
	}
	if sel.Empty() {
		t.Error("the PodMonitor selects every pod of its namespace")
	}
	if len(pm.Spec.PodMetricsEndpoints) == 0 {
		t.Fatal("no podMetricsEndpoints")
	}
	for _, c := range []struct{ dir, deployment string }{
		{"kubernetes/base", "trends-api"},
		{"kubernetes/overlays/example", "trends-api"},
		{"kubernetes/standalone", "hotcount"},
	} {
		t.Run(c.dir, func(t *testing.T) {
			var d appsv1.Deployment
			found := false
			for _, o := range renderedObjects(t, c.dir) {
				if o.kind == "Deployment" && o.name == c.deployment {
					o.strictInto(t, &d)
					found = true
				}
			}
			if !found {
				t.Fatalf("no Deployment %s", c.deployment)
			}
			tmpl := d.Spec.Template
			if !sel.Matches(k8slabels.Set(tmpl.Labels)) {
				t.Fatalf("the PodMonitor's selector %s does not select the pod labels %v", sel, tmpl.Labels)
			}
			containers := append(slices.Clone(tmpl.Spec.InitContainers), tmpl.Spec.Containers...)
			for i, ep := range pm.Spec.PodMetricsEndpoints {
				if ep.Port == nil || *ep.Port == "" {
					t.Errorf("endpoint %d: no port name", i)
					continue
				}
				var kept []string
				for _, ct := range containers {
					keep, err := keepsContainer(ep.RelabelConfigs, ct.Name)
					if err != nil {
						t.Fatalf("endpoint %d: %v", i, err)
					}
					if !keep {
						continue
					}
					kept = append(kept, ct.Name)
					port := slices.IndexFunc(ct.Ports, func(p corev1.ContainerPort) bool { return p.Name == *ep.Port })
					if port < 0 {
						t.Errorf("endpoint %d: container %s has no port %q (ports %+v)", i, ct.Name, *ep.Port, ct.Ports)
						continue
					}
					if want := tmpl.Annotations["prometheus.io/port"]; want != "" && fmt.Sprint(ct.Ports[port].ContainerPort) != want {
						t.Errorf("endpoint %d: port %s is %d, the pod announces %s", i, *ep.Port, ct.Ports[port].ContainerPort, want)
					}
				}
				if !slices.Equal(kept, []string{"hotcount"}) {
					t.Errorf("endpoint %d scrapes containers %v, want hotcount only", i, kept)
				}
				path := cmp.Or(ep.Path, "/metrics")
				if want := cmp.Or(tmpl.Annotations["prometheus.io/path"], "/metrics"); path != want {
					t.Errorf("endpoint %d: path %s, the pod announces %s", i, path, want)
				}
			}
		})
	}
}

// keepsContainer applies the endpoint's relabelings to a target of the
// container named name, as far as they read the container's name; any
// other relabeling is beyond what this test models and is an error.
func keepsContainer(rcs []monitoringv1.RelabelConfig, name string) (bool, error) {
	for _, rc := range rcs {
		action := strings.ToLower(cmp.Or(rc.Action, "replace"))
		if action != "keep" && action != "drop" {
			continue // rewrites labels, keeps the target
		}
		if len(rc.SourceLabels) != 1 || rc.SourceLabels[0] != "__meta_kubernetes_pod_container_name" {
			return false, fmt.Errorf("relabeling %+v: this test models keep/drop on __meta_kubernetes_pod_container_name only", rc)
		}
		re, err := regexp.Compile("^(?:" + cmp.Or(rc.Regex, "(.*)") + ")$")
		if err != nil {
			return false, err
		}
		if re.MatchString(name) != (action == "keep") {
			return false, nil
		}
	}
	return true, nil
}
