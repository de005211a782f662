package deploy_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/nats-io/nats.go/jetstream"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/spf13/pflag"
	yamlv3 "go.yaml.in/yaml/v3"
	"helm.sh/helm/v4/pkg/chart/common"
	chartvalues "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	release "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// The Helm chart (helm/hotcount) and the example application chart that
// adds hotcount to its pods as a native sidecar through the chart's named
// templates (helm/example-app), checked with Helm's Go SDK as `helm lint
// --strict` and `helm template` would, without a helm binary or a cluster.
const (
	chartDir      = "helm/hotcount"
	exampleDir    = "helm/example-app"
	helmNamespace = "trends"
)

// helmKube is the Kubernetes version the chart is rendered and linted for:
// k8s.io/api's, the types the objects are decoded into (the SDK's own
// default, without the helm binary's build flags, is 1.20).
var helmKube = func() *common.KubeVersion {
	kv, err := common.ParseKubeVersion("v1.37.0")
	if err != nil {
		panic(err)
	}
	return kv
}()

// helmRelease is a rendered chart: every object decoded strictly into its
// type, the hooks apart.
type helmRelease struct {
	objects
	secrets     map[string]corev1.Secret
	jobs        map[string]batchv1.Job
	podMonitors map[string]monitoringv1.PodMonitor
	rules       map[string]monitoringv1.PrometheusRule
	// hooks are the objects Helm runs as hooks, by kind/name.
	hooks map[string]*release.Hook
	// docs are every object's YAML, by kind/name.
	docs  map[string][]byte
	notes string
	// text is the release as helm template prints it: the hooks, then
	// the objects in install order.
	text string
}

// loadChart loads the chart in dir as helm does; the example application
// gets the hotcount chart as its dependency, as `helm dependency build`
// would put it in its charts/.
func loadChart(t *testing.T, dir string) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatalf("load %s: %v", dir, err)
	}
	if dir == exampleDir {
		ch.AddDependency(loadChart(t, chartDir))
	}
	return ch
}

// readValues reads a values file (ci/*-values.yaml) as helm -f does.
func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	v, err := common.ReadValuesFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// helmTemplate renders ch with vals as `helm template --namespace trends
// NAME` does (the kubeVersion check, dependencies, the values' schema,
// every template, NOTES.txt apart, hooks sorted out), but strictly: a
// template that reads a value which is not there fails.
func helmTemplate(ch *chart.Chart, name string, vals map[string]any) (files map[string]string, hooks []*release.Hook, manifests []releaseutil.Manifest, notes string, err error) {
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *helmKube
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, caps.KubeVersion.String()) {
		return nil, nil, nil, "", fmt.Errorf("chart requires kubeVersion %s, not %s", ch.Metadata.KubeVersion, caps.KubeVersion.Version)
	}
	if vals == nil {
		vals = map[string]any{}
	}
	if err := chartutil.ProcessDependencies(ch, vals); err != nil {
		return nil, nil, nil, "", err
	}
	top, err := chartvalues.ToRenderValuesWithSchemaValidation(ch, vals, common.ReleaseOptions{
		Name: name, Namespace: helmNamespace, Revision: 1, IsInstall: true,
	}, caps, false)
	if err != nil {
		return nil, nil, nil, "", err
	}
	files, err = engine.Engine{Strict: true}.RenderWithContext(context.Background(), ch, top)
	if err != nil {
		return nil, nil, nil, "", err
	}
	for k, v := range files {
		if strings.HasSuffix(k, "/NOTES.txt") {
			if k == ch.Name()+"/templates/NOTES.txt" {
				notes = v
			}
			delete(files, k)
		}
	}
	hooks, manifests, err = releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	return files, hooks, manifests, notes, err
}

// renderChart renders the chart in dir as release name and decodes every
// object strictly.
func renderChart(t *testing.T, dir, name string, vals map[string]any) helmRelease {
	t.Helper()
	_, hooks, manifests, notes, err := helmTemplate(loadChart(t, dir), name, vals)
	if err != nil {
		t.Fatalf("helm template %s: %v", dir, err)
	}
	r := helmRelease{
		objects: newObjects(), secrets: map[string]corev1.Secret{}, jobs: map[string]batchv1.Job{},
		podMonitors: map[string]monitoringv1.PodMonitor{}, rules: map[string]monitoringv1.PrometheusRule{},
		hooks: map[string]*release.Hook{}, docs: map[string][]byte{}, notes: notes,
	}
	add := func(kind, name, path, doc string) {
		key := kind + "/" + name
		if _, dup := r.docs[key]; dup {
			t.Errorf("%s: %s rendered twice", path, key)
		}
		r.docs[key] = []byte(doc)
		if _, ok := r.add(t, []byte(doc)); ok {
			return
		}
		what := path + ": " + key
		switch kind {
		case "Secret":
			file(t, []byte(doc), what, r.secrets)
		case "Job":
			file(t, []byte(doc), what, r.jobs)
		case "PodMonitor":
			file(t, []byte(doc), what, r.podMonitors)
		case "PrometheusRule":
			file(t, []byte(doc), what, r.rules)
		default:
			t.Errorf("%s: unexpected kind %s", path, kind)
		}
	}
	var text strings.Builder
	for _, h := range hooks {
		add(h.Kind, h.Name, h.Path, h.Manifest)
		r.hooks[h.Kind+"/"+h.Name] = h
		fmt.Fprintf(&text, "---\n# Source: %s\n%s\n", h.Path, h.Manifest)
	}
	for _, m := range manifests {
		add(m.Head.Kind, m.Head.Metadata.Name, m.Name, m.Content)
		fmt.Fprintf(&text, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	r.text = text.String()
	// Every object is the release's: named, in no namespace of its own (helm
	// puts it in the release's), and, but for the example's own, labelled as
	// Helm's.
	for key, doc := range r.docs {
		var m metav1.PartialObjectMetadata
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if m.Namespace != "" {
			t.Errorf("%s sets namespace %s", key, m.Namespace)
		}
		if m.Labels["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("%s lacks the label app.kubernetes.io/managed-by: Helm (%v)", key, m.Labels)
		}
	}
	return r
}

// ciValues lists the chart's ci/*-values.yaml, as chart-testing runs them.
func ciValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("ci values files %v (%v): want at least standalone, partitioned and sidecar", files, err)
	}
	return files
}

// lintStrict lints the chart in dir with vals as `helm lint --strict`: a
// warning fails as an error does.
func lintStrict(t *testing.T, dir string, vals map[string]any) {
	t.Helper()
	res := lint.RunAll(dir, vals, helmNamespace, lint.WithKubeVersion(helmKube))
	for _, m := range res.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint --strict %s: %s", dir, m)
		} else {
			t.Logf("helm lint %s: %s", dir, m)
		}
	}
}

// TestHelmLint lints the chart, with its defaults and with each ci values
// file, and the example application with the chart as its dependency.
func TestHelmLint(t *testing.T) {
	// Native sidecars: 1.29 or later.
	for _, ch := range []*chart.Chart{loadChart(t, chartDir), loadChart(t, exampleDir)} {
		if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, "v1.29.0") || chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, "v1.28.9") {
			t.Errorf("chart %s: kubeVersion %q, want 1.29 or later", ch.Name(), ch.Metadata.KubeVersion)
		}
	}
	t.Run("defaults", func(t *testing.T) { lintStrict(t, chartDir, nil) })
	for _, f := range ciValues(t) {
		t.Run(filepath.Base(f), func(t *testing.T) { lintStrict(t, chartDir, readValues(t, f)) })
	}
	t.Run("example-app", func(t *testing.T) {
		// helm dependency build's layout: the dependency in charts/.
		dir := filepath.Join(t.TempDir(), "example-app")
		if err := os.CopyFS(dir, os.DirFS(exampleDir)); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(filepath.Join(dir, "charts", "hotcount"), os.DirFS(chartDir)); err != nil {
			t.Fatal(err)
		}
		lintStrict(t, dir, nil)
	})
}

// chartCase is one way to install the chart: its values, and whether the
// pool or the sidecar is what it runs.
type chartCase struct {
	name     string
	vals     map[string]any
	sidecar  bool
	settings map[string]any // the values' hotcount block
}

func chartCases(t *testing.T) []chartCase {
	t.Helper()
	cases := []chartCase{{name: "defaults", vals: map[string]any{}}}
	for _, f := range ciValues(t) {
		cases = append(cases, chartCase{name: filepath.Base(f), vals: readValues(t, f)})
	}
	// The token file elsewhere: the Secret's key is mounted under its name.
	cases = append(cases, chartCase{name: "token file elsewhere", vals: map[string]any{
		"hotcount": map[string]any{"httpTokenFile": "/etc/hotcount/lookup-token.txt"},
	}})
	// The setup hooks' own ServiceAccount, labelled, without the token.
	cases = append(cases, chartCase{name: "setup account", vals: map[string]any{
		"setup": map[string]any{
			"table": map[string]any{"enabled": true},
			"serviceAccount": map[string]any{
				"annotations":                  map[string]any{"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/hotcount-admin"},
				"labels":                       map[string]any{"team": "platform"},
				"automountServiceAccountToken": false,
			},
		},
	}})
	for i := range cases {
		cases[i].classify()
	}
	return cases
}

// classify notes whether c runs the sidecar and which settings it gives.
func (c *chartCase) classify() {
	c.sidecar = dig(c.vals, "standalone", "enabled") == false
	c.settings, _ = c.vals["hotcount"].(map[string]any)
}

// TestHelmRender renders the chart with its defaults and with each ci
// values file and checks what the Kustomize bases are held to: the pool's
// invariants (TestStandalone's) or, with standalone.enabled false, the
// sidecar's, in the example application that includes it (TestSidecar's);
// that hotcount runs with the settings the values give; and the setup
// hooks, the lookup token Secret and the operator pack.
func TestHelmRender(t *testing.T) {
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) { checkChartCase(t, c) })
	}
}

// checkChartCase renders the chart as release hotcount with c's values and
// checks it as TestHelmRender says, and returns the chart's release.
func checkChartCase(t *testing.T, c chartCase) helmRelease {
	t.Helper()
	r := renderChart(t, chartDir, "hotcount", c.vals)
	chartRel := r
	var (
		cfg  config.Config
		pods []corev1.PodTemplateSpec
	)
	if c.sidecar {
		for kind, names := range map[string][]string{
			"Deployment": slices.Collect(maps.Keys(r.deployments)), "Service": slices.Collect(maps.Keys(r.services)),
			"Secret": slices.Collect(maps.Keys(r.secrets)), "NetworkPolicy": slices.Collect(maps.Keys(r.netpols)),
			"PodDisruptionBudget": slices.Collect(maps.Keys(r.pdbs)),
		} {
			if len(names) > 0 {
				t.Errorf("standalone.enabled is false, yet the chart renders %s %v", kind, names)
			}
		}
		if !strings.Contains(r.notes, "hotcount.sidecarContainer") {
			t.Errorf("NOTES.txt does not say how to add the sidecar:\n%s", r.notes)
		}
		// The example application, with these values as its
		// dependency's.
		app := renderChart(t, exampleDir, "trends-api", map[string]any{"hotcount": c.vals})
		hc, appCfg := checkSidecar(t, app.objects, "trends-api")
		cfg = appCfg
		pods = append(pods, app.deployments["trends-api"].Spec.Template)
		d := app.deployments["trends-api"]
		checkChecksum(t, d.Spec.Template, app.objects, hc)
		r = app
	} else {
		cfg = checkPool(t, r.objects, "hotcount")
		d := r.deployments["hotcount"]
		pods = append(pods, d.Spec.Template)
		checkChecksum(t, d.Spec.Template, r.objects, d.Spec.Template.Spec.Containers[0])
		checkLookupToken(t, r, d, c.vals, cfg)
		if !strings.Contains(r.notes, "/v1/topics/") {
			t.Errorf("NOTES.txt does not say where the lookup API is:\n%s", r.notes)
		}
	}
	checkSettings(t, c.settings, cfg)
	checkSetupHooks(t, r, c.vals)
	checkOperatorPack(t, r, pods)
	return chartRel
}

// checkSettings asserts that hotcount runs with every setting of the
// values' hotcount block: each key is the camelCase of a flag whose value,
// as hotcount parsed it from the container's environment, is the value
// given.
func checkSettings(t *testing.T, settings map[string]any, cfg config.Config) {
	t.Helper()
	if len(settings) == 0 {
		return
	}
	got := (&cfg).FlagSet("got", nil)
	for key, v := range settings {
		flag := kebab(key)
		f := got.Lookup(flag)
		if f == nil {
			t.Errorf("hotcount.%s names no setting (--%s)", key, flag)
			continue
		}
		def := config.Default()
		want := def.FlagSet("want", nil)
		if err := want.Set(flag, valueString(v)); err != nil {
			t.Errorf("hotcount.%s: %v", key, err)
			continue
		}
		if f.Value.String() != want.Lookup(flag).Value.String() {
			t.Errorf("hotcount.%s is %v, but hotcount runs with --%s %s", key, v, flag, f.Value)
		}
	}
}

// valueString is a value of the values files as the chart writes it.
func valueString(v any) string {
	if f, ok := v.(float64); ok && f == float64(int64(f)) {
		return fmt.Sprint(int64(f))
	}
	return fmt.Sprint(v)
}

// kebab is a flag's name from its key in the values (flushInterval:
// flush-interval).
func kebab(key string) string {
	var b strings.Builder
	for _, r := range key {
		if unicode.IsUpper(r) {
			b.WriteByte('-')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// camel is a flag's key in the values (flush-interval: flushInterval).
func camel(flag string) string {
	parts := strings.Split(flag, "-")
	for i := 1; i < len(parts); i++ {
		parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
	}
	return strings.Join(parts, "")
}

// checkChecksum asserts that the pod template carries a checksum of the
// settings' ConfigMap, so that changing a setting rolls the pods.
func checkChecksum(t *testing.T, tmpl corev1.PodTemplateSpec, o objects, c corev1.Container) {
	t.Helper()
	found := false
	for k, v := range tmpl.Annotations {
		if strings.HasPrefix(k, "checksum/") && len(v) == 64 {
			found = true
		}
	}
	if !found {
		t.Errorf("the pod template has no checksum of the settings: %v", tmpl.Annotations)
	}
	if tmpl.Annotations["prometheus.io/port"] != fmt.Sprint(adminPort(t, c)) {
		t.Errorf("the pod announces port %s for metrics, the admin port is %d", tmpl.Annotations["prometheus.io/port"], adminPort(t, c))
	}
}

func adminPort(t *testing.T, c corev1.Container) int32 {
	t.Helper()
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "admin" })
	if i < 0 {
		t.Fatalf("container %s has no admin port", c.Name)
	}
	return c.Ports[i].ContainerPort
}

// checkLookupToken asserts that the pool's token Secret is the chart's,
// with a token hotcount accepts, unless the values name one of theirs.
func checkLookupToken(t *testing.T, r helmRelease, d appsv1.Deployment, vals map[string]any, cfg config.Config) {
	t.Helper()
	existing, _ := dig(vals, "lookupToken", "existingSecret").(string)
	var secretName string
	pod := d.Spec.Template.Spec
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		secretName = v.Secret.SecretName
		// The file hotcount reads is the Secret's key token.
		file := "token"
		for _, it := range v.Secret.Items {
			if it.Key == "token" {
				file = it.Path
			}
		}
		for _, m := range pod.Containers[0].VolumeMounts {
			if m.Name == v.Name && filepath.Join(m.MountPath, file) != cfg.HTTPTokenFile {
				t.Errorf("the Secret's token is at %s, hotcount reads %s", filepath.Join(m.MountPath, file), cfg.HTTPTokenFile)
			}
		}
	}
	switch {
	case existing != "":
		if secretName != existing {
			t.Errorf("the pool mounts Secret %q, not lookupToken.existingSecret %q", secretName, existing)
		}
		if len(r.secrets) > 0 {
			t.Errorf("lookupToken.existingSecret is set, yet the chart renders Secrets %v", slices.Collect(maps.Keys(r.secrets)))
		}
	default:
		s, ok := r.secrets[secretName]
		if !ok {
			t.Fatalf("the pool mounts Secret %q, which the chart does not render", secretName)
		}
		if tok := strings.TrimSpace(string(s.Data["token"])); len(tok) < 16 {
			t.Errorf("Secret %s: token of %d bytes; hotcount requires 16 or more", secretName, len(tok))
		}
	}
}

// dig is the value at path in vals, or nil.
func dig(vals map[string]any, path ...string) any {
	var v any = vals
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// checkSetupHooks asserts that the setup jobs the values turn on are hooks
// that run before the release's pods, on install and on every upgrade,
// under their own ServiceAccount (a hook that comes first: the release's
// objects do not exist yet), locked down as the pool is, with settings
// hotcount accepts.
func checkSetupHooks(t *testing.T, r helmRelease, vals map[string]any) {
	t.Helper()
	want := map[string]bool{}
	for _, cmd := range []string{"table", "stream"} {
		if dig(vals, "setup", cmd, "enabled") == true {
			want[cmd+" create"] = true
		}
	}
	got := map[string]bool{}
	for name, j := range r.jobs {
		h := r.hooks["Job/"+name]
		if h == nil {
			t.Errorf("Job %s is not a hook", name)
			continue
		}
		if !slices.Contains(h.Events, release.HookPreInstall) || !slices.Contains(h.Events, release.HookPreUpgrade) {
			t.Errorf("Job %s runs on %v, want pre-install and pre-upgrade", name, h.Events)
		}
		if !slices.Contains(h.DeletePolicies, release.HookBeforeHookCreation) {
			t.Errorf("Job %s: delete policies %v lack before-hook-creation: the next upgrade could not create it again", name, h.DeletePolicies)
		}
		pod := j.Spec.Template.Spec
		if pod.RestartPolicy != corev1.RestartPolicyNever || len(pod.Containers) != 1 {
			t.Errorf("Job %s: restartPolicy %s, %d containers", name, pod.RestartPolicy, len(pod.Containers))
			continue
		}
		c := pod.Containers[0]
		cmd := strings.Join(c.Args[:min(2, len(c.Args))], " ")
		got[cmd] = true
		sa := r.hooks["ServiceAccount/"+pod.ServiceAccountName]
		if sa == nil || sa.Weight >= h.Weight || !slices.Contains(sa.Events, release.HookPreInstall) {
			t.Errorf("Job %s runs as %s, which is no hook created before it", name, pod.ServiceAccountName)
		}
		for _, jc := range slices.Concat(pod.InitContainers, pod.Containers) {
			if err := lockedDown(pod.SecurityContext, jc); err != nil {
				t.Errorf("Job %s: container %s is not locked down: %v", name, jc.Name, err)
			}
			if jc.Resources.Limits.Memory().IsZero() {
				t.Errorf("Job %s: container %s has no memory limit", name, jc.Name)
			}
		}
		if pod.ActiveDeadlineSeconds == nil && j.Spec.ActiveDeadlineSeconds == nil {
			t.Errorf("Job %s has no deadline: a setup that hangs would hold the install for ever", name)
		}
		// The settings are hotcount's (run's: the setup commands take a
		// part of them and pass over the rest).
		cfg := config.Default()
		if err := config.Parse(cfg.FlagSet("run", nil), nil, jobEnv(c)); err != nil {
			t.Errorf("Job %s: settings rejected: %v", name, err)
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("setup jobs run %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	// The setup ServiceAccount's labels and token mount are the values'.
	for name, j := range r.jobs {
		saName := j.Spec.Template.Spec.ServiceAccountName
		sa, ok := r.serviceAccounts[saName]
		if !ok {
			continue
		}
		if labels, _ := dig(vals, "setup", "serviceAccount", "labels").(map[string]any); len(labels) > 0 {
			for k, v := range labels {
				if sa.Labels[k] != v {
					t.Errorf("Job %s: ServiceAccount %s has label %s=%q, setup.serviceAccount.labels says %q", name, saName, k, sa.Labels[k], v)
				}
			}
		}
		mount := true
		if v, ok := dig(vals, "setup", "serviceAccount", "automountServiceAccountToken").(bool); ok {
			mount = v
		}
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken != mount {
			t.Errorf("Job %s: ServiceAccount %s automounts its token: %v, setup.serviceAccount.automountServiceAccountToken says %v", name, saName, sa.AutomountServiceAccountToken, mount)
		}
		if strings.HasSuffix(name, "-table-create") && !strings.HasPrefix(sa.Annotations["eks.amazonaws.com/role-arn"], "arn:aws:iam::") {
			t.Errorf("Job %s: ServiceAccount %s has no IRSA role for table create", name, saName)
		}
	}
	// table create needs iam/policy-admin.json: a role the pods' must not
	// be.
	const irsa = "eks.amazonaws.com/role-arn"
	for name, j := range r.jobs {
		role := r.serviceAccounts[j.Spec.Template.Spec.ServiceAccountName].Annotations[irsa]
		if role == "" {
			continue
		}
		for sa, acct := range r.serviceAccounts {
			if r.hooks["ServiceAccount/"+sa] == nil && acct.Annotations[irsa] == role {
				t.Errorf("Job %s runs with the role of ServiceAccount %s (%s): the pods' role would hold the setup's rights", name, sa, role)
			}
		}
	}
}

// jobEnv is a container's environment, the variables from Secrets aside.
func jobEnv(c corev1.Container) []string {
	var env []string
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	return env
}

// checkOperatorPack asserts that the PodMonitor scrapes the hotcount
// container, and only it, of each pod template given, and that the
// PrometheusRule and the dashboard are deploy/observability's.
func checkOperatorPack(t *testing.T, r helmRelease, pods []corev1.PodTemplateSpec) {
	t.Helper()
	for name, pm := range r.podMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Errorf("PodMonitor %s: selector %v (%v) selects every pod of the namespace", name, sel, err)
			continue
		}
		for _, tmpl := range pods {
			if !sel.Matches(k8slabels.Set(tmpl.Labels)) {
				t.Errorf("PodMonitor %s: selector %s does not select the pods %v", name, sel, tmpl.Labels)
			}
			containers := append(slices.Clone(tmpl.Spec.InitContainers), tmpl.Spec.Containers...)
			for i, ep := range pm.Spec.PodMetricsEndpoints {
				var kept []string
				for _, c := range containers {
					keep, err := keepsContainer(ep.RelabelConfigs, c.Name)
					if err != nil {
						t.Fatalf("PodMonitor %s endpoint %d: %v", name, i, err)
					}
					if keep {
						kept = append(kept, c.Name)
						if ep.Port == nil || !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == *ep.Port }) {
							t.Errorf("PodMonitor %s endpoint %d: port %q is not a port of %s", name, i, *cmp.Or(ep.Port, new(string)), c.Name)
						}
					}
				}
				if !slices.Equal(kept, []string{"hotcount"}) {
					t.Errorf("PodMonitor %s endpoint %d scrapes containers %v, want hotcount only", name, i, kept)
				}
			}
		}
	}
	if len(r.rules) > 0 {
		want := readYAML(t, obsRules)
		for name := range r.rules {
			var pr struct {
				Spec any `json:"spec"`
			}
			if err := yaml.Unmarshal(r.docs["PrometheusRule/"+name], &pr); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(pr.Spec, want) {
				t.Errorf("PrometheusRule %s: spec is not %s", name, obsRules)
			}
		}
	}
	for name, cm := range r.configMaps {
		if dash, ok := cm.Data["hotcount.json"]; ok {
			want, err := os.ReadFile(obsDashboard)
			if err != nil {
				t.Fatal(err)
			}
			if dash != string(want) {
				t.Errorf("ConfigMap %s: hotcount.json is not %s", name, obsDashboard)
			}
		}
	}
}

// readYAML reads a YAML file as a generic value, as sigs.k8s.io/yaml reads
// a rendered object.
func readYAML(t *testing.T, path string) any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// TestHelmFilesAreObservability: the chart's copies of the operator pack's
// files are deploy/observability's, byte for byte (the chart cannot read
// outside its folder once packaged).
func TestHelmFilesAreObservability(t *testing.T) {
	for _, f := range []string{obsRules, obsDashboard} {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		copied := filepath.Join(chartDir, "files", filepath.Base(f))
		got, err := os.ReadFile(copied)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s: cp %s %s", copied, f, f, copied)
		}
	}
	// Rendered with every flag on, the pack is there.
	r := renderChart(t, chartDir, "hotcount", map[string]any{"metrics": map[string]any{
		"podMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}, "dashboard": map[string]any{"enabled": true},
	}})
	if len(r.podMonitors) != 1 || len(r.rules) != 1 || len(r.configMaps) != 2 {
		t.Fatalf("metrics on: %d PodMonitors, %d PrometheusRules, %d ConfigMaps; want one each and the settings'", len(r.podMonitors), len(r.rules), len(r.configMaps))
	}
	checkOperatorPack(t, r, []corev1.PodTemplateSpec{r.deployments["hotcount"].Spec.Template})
	// Off by default: the CRDs may not be installed.
	r = renderChart(t, chartDir, "hotcount", nil)
	if len(r.podMonitors)+len(r.rules) > 0 || len(r.configMaps) != 1 {
		t.Errorf("metrics off by default, yet %d PodMonitors, %d PrometheusRules, %d ConfigMaps", len(r.podMonitors), len(r.rules), len(r.configMaps))
	}
}

// normalContainer is c without what may differ between the chart and the
// Kustomize bases for the same settings: the image and its pull policy,
// and the name of the settings' ConfigMap (its contents are compared as
// the settings hotcount runs with).
func normalContainer(t *testing.T, o objects, c corev1.Container) corev1.Container {
	t.Helper()
	c = *c.DeepCopy()
	c.Image, c.ImagePullPolicy = "", ""
	for i, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			if _, ok := o.configMaps[ef.ConfigMapRef.Name]; !ok {
				t.Fatalf("envFrom names ConfigMap %q, which is not rendered", ef.ConfigMapRef.Name)
			}
			c.EnvFrom[i].ConfigMapRef.Name = "<settings>"
		}
	}
	return c
}

// samePod asserts that two pod templates run hotcount alike: the same
// container spec (normalContainer's), the same pod security context,
// grace period, volumes and ServiceAccount, and the same settings.
func samePod(t *testing.T, chartObjs, kustObjs objects, chartPod, kustPod corev1.PodSpec, chartC, kustC corev1.Container, chartCfg, kustCfg config.Config) {
	t.Helper()
	diff := func(what string, got, want any) {
		if !reflect.DeepEqual(got, want) {
			g, _ := yaml.Marshal(got)
			w, _ := yaml.Marshal(want)
			t.Errorf("%s differ:\nchart:\n%s\nkustomize:\n%s", what, g, w)
		}
	}
	diff("containers", normalContainer(t, chartObjs, chartC), normalContainer(t, kustObjs, kustC))
	diff("pod security contexts", chartPod.SecurityContext, kustPod.SecurityContext)
	diff("grace periods", chartPod.TerminationGracePeriodSeconds, kustPod.TerminationGracePeriodSeconds)
	diff("volumes", chartPod.Volumes, kustPod.Volumes)
	diff("ServiceAccounts", chartPod.ServiceAccountName, kustPod.ServiceAccountName)
	diff("settings", chartCfg, kustCfg)
}

// TestHelmMatchesKustomize: for the same settings the chart and the
// Kustomize bases run hotcount with the same container spec (the image
// aside): args, environment, ports, probes, resources, security context;
// and the same pod around it. The chart's defaults are
// kubernetes/standalone; the example application's are kubernetes/base,
// and with the overlay's settings, kubernetes/overlays/example.
func TestHelmMatchesKustomize(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		k := render(t, "kubernetes/standalone")
		kcfg := checkPool(t, k, "hotcount")
		h := renderChart(t, chartDir, "hotcount", nil)
		hcfg := checkPool(t, h.objects, "hotcount")
		kd, hd := k.deployments["hotcount"], h.deployments["hotcount"]
		samePod(t, h.objects, k, hd.Spec.Template.Spec, kd.Spec.Template.Spec, hd.Spec.Template.Spec.Containers[0], kd.Spec.Template.Spec.Containers[0], hcfg, kcfg)
		if *hd.Spec.Replicas != *kd.Spec.Replicas {
			t.Errorf("replicas %d, Kustomize %d", *hd.Spec.Replicas, *kd.Spec.Replicas)
		}
		if !reflect.DeepEqual(h.services["hotcount"].Spec.Ports, k.services["hotcount"].Spec.Ports) {
			t.Errorf("Service ports %+v, Kustomize %+v", h.services["hotcount"].Spec.Ports, k.services["hotcount"].Spec.Ports)
		}
		if !reflect.DeepEqual(h.pdbs["hotcount"].Spec.MaxUnavailable, k.pdbs["hotcount"].Spec.MaxUnavailable) {
			t.Errorf("PDB %+v, Kustomize %+v", h.pdbs["hotcount"].Spec, k.pdbs["hotcount"].Spec)
		}
		hn, kn := h.netpols["hotcount"].Spec, k.netpols["hotcount"].Spec
		if !reflect.DeepEqual(hn.Ingress, kn.Ingress) || !reflect.DeepEqual(hn.PolicyTypes, kn.PolicyTypes) {
			t.Errorf("NetworkPolicy %+v, Kustomize %+v", hn, kn)
		}
		if ha, ka := h.serviceAccounts["hotcount"].Annotations, k.serviceAccounts["hotcount"].Annotations; !maps.Equal(ha, ka) {
			t.Errorf("ServiceAccount annotations %v, Kustomize %v", ha, ka)
		}
	})
	for _, c := range []struct {
		dir  string
		vals map[string]any
	}{
		{"kubernetes/base", nil},
		{"kubernetes/overlays/example", map[string]any{"hotcount": map[string]any{
			"image":          map[string]any{"repository": "your-registry/hotcount"},
			"serviceAccount": map[string]any{"annotations": map[string]any{"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/trends-hotcount"}},
			"hotcount":       map[string]any{"table": "trends-hotcount", "shards": 8},
		}}},
	} {
		t.Run(c.dir, func(t *testing.T) {
			k := render(t, c.dir)
			kc, kcfg := checkSidecar(t, k, "trends-api")
			h := renderChart(t, exampleDir, "trends-api", c.vals)
			hc, hcfg := checkSidecar(t, h.objects, "trends-api")
			kd, hd := k.deployments["trends-api"], h.deployments["trends-api"]
			samePod(t, h.objects, k, hd.Spec.Template.Spec, kd.Spec.Template.Spec, hc, kc, hcfg, kcfg)
			if !strings.HasPrefix(hc.Image, strings.SplitN(kc.Image, ":", 2)[0]+":") {
				t.Errorf("image %s, Kustomize %s", hc.Image, kc.Image)
			}
			if ha, ka := h.serviceAccounts["trends-api"].Annotations, k.serviceAccounts["trends-api"].Annotations; !maps.Equal(ha, ka) {
				t.Errorf("ServiceAccount annotations %v, Kustomize %v", ha, ka)
			}
			for _, name := range []string{"trends-api-hotcount-metrics"} {
				if !reflect.DeepEqual(h.services[name].Spec, k.services[name].Spec) {
					t.Errorf("Service %s %+v, Kustomize %+v", name, h.services[name].Spec, k.services[name].Spec)
				}
			}
		})
	}
}

// schemaProperties is the properties of the object at path in the
// chart's values.schema.json.
func schemaProperties(t *testing.T, path ...string) map[string]map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	for _, p := range path {
		s, _ = dig(s, "properties", p).(map[string]any)
	}
	out := map[string]map[string]any{}
	for k, v := range s["properties"].(map[string]any) {
		out[k] = v.(map[string]any)
	}
	return out
}

// settingsFlags are the settings of `hotcount run` the chart's hotcount
// block takes: all but --config (the chart passes the environment) and
// --nats-token (a secret, in extraEnv from a Secret, never in a
// ConfigMap).
func settingsFlags() map[string]*pflag.Flag {
	out := map[string]*pflag.Flag{}
	cfg := config.Default()
	cfg.FlagSet("run", nil).VisitAll(func(f *pflag.Flag) {
		if f.Name != "config" && f.Name != "nats-token" {
			out[f.Name] = f
		}
	})
	return out
}

// TestHelmSettings: the hotcount block of the values is hotcount's
// settings, one key per flag and no other; each reaches hotcount as its
// own variable; and the schema's bounds and choices are hotcount's own.
func TestHelmSettings(t *testing.T) {
	t.Parallel() // with the other two longest of deploy's tests: it runs last in make test, a core free
	props := schemaProperties(t, "hotcount")
	flags := settingsFlags()
	for flag := range flags {
		if _, ok := props[camel(flag)]; !ok {
			t.Errorf("--%s has no key hotcount.%s in values.schema.json", flag, camel(flag))
		}
	}
	for key := range props {
		if _, ok := flags[kebab(key)]; !ok || camel(kebab(key)) != key {
			t.Errorf("values.schema.json: hotcount.%s is no setting of hotcount run", key)
		}
	}

	// Every setting at hotcount's own default, spelled as values: hotcount
	// runs with exactly its defaults, from one variable per setting.
	block := map[string]any{}
	for name, f := range flags {
		var v any = f.DefValue
		switch f.Value.Type() {
		case "int", "int64":
			var n int64
			fmt.Sscan(f.DefValue, &n)
			v = n
		case "bool":
			v = f.DefValue == "true"
		}
		block[camel(name)] = v
	}
	block["dataDir"] = "/var/lib/hotcount" // a mount path must be absolute
	// The pool's lookup API is reached through its Service, with the token.
	block["http"], block["httpTokenFile"] = ":8080", "/var/run/secrets/hotcount/token"
	r := renderChart(t, chartDir, "hotcount", map[string]any{"hotcount": block})
	cm := r.configMaps["hotcount"]
	var keys []string
	for name := range flags {
		keys = append(keys, config.EnvPrefix+strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	}
	if got := slices.Sorted(maps.Keys(cm.Data)); !slices.Equal(got, slices.Sorted(slices.Values(keys))) {
		t.Errorf("the ConfigMap has variables %v, want %v", got, slices.Sorted(slices.Values(keys)))
	}
	d := r.deployments["hotcount"]
	cfg := checkHotcount(t, r.objects, d.Spec.Template.Spec, d.Spec.Template.Spec.Containers[0])
	want := config.Default()
	want.DataDir, want.HTTPAddr, want.HTTPTokenFile = "/var/lib/hotcount", ":8080", "/var/run/secrets/hotcount/token"
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("every setting at its default, hotcount runs with\n%+v\nnot its defaults\n%+v", cfg, want)
	}

	// Bounds and choices: what the schema accepts at its edges hotcount
	// accepts, and one step beyond both refuse, naming the setting. In
	// partitioned mode every setting is checked.
	validate := func(flag, v string) error {
		cfg := config.Default()
		env := []string{"HOTCOUNT_NATS_MODE=partitioned", config.EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) + "=" + v}
		if err := config.Parse(cfg.FlagSet("run", nil), nil, env); err != nil {
			return err
		}
		return cfg.Validate()
	}
	ch := loadChart(t, chartDir)
	render := func(key string, v any) error {
		_, _, _, _, err := helmTemplate(ch, "hotcount", map[string]any{"hotcount": map[string]any{key: v}})
		return err
	}
	for key, p := range props {
		flag := kebab(key)
		if lo, ok := p["minimum"].(float64); ok {
			hi := p["maximum"].(float64)
			for _, v := range []int64{int64(lo), int64(hi)} {
				if err := validate(flag, fmt.Sprint(v)); err != nil {
					t.Errorf("hotcount.%s: the schema accepts %d, hotcount refuses it: %v", key, v, err)
				}
				if err := render(key, v); err != nil {
					t.Errorf("hotcount.%s: %d does not render: %v", key, v, err)
				}
			}
			for _, v := range []int64{int64(lo) - 1, int64(hi) + 1} {
				if err := validate(flag, fmt.Sprint(v)); err == nil || !strings.Contains(err.Error(), flag) {
					t.Errorf("hotcount.%s: hotcount takes %d, outside the schema's %d..%d (%v)", key, v, int64(lo), int64(hi), err)
				}
				if err := render(key, v); err == nil || !strings.Contains(err.Error(), "/hotcount/"+key) {
					t.Errorf("hotcount.%s: %d renders, or fails without naming the key: %v", key, v, err)
				}
			}
		}
		if enum, ok := p["enum"].([]any); ok {
			for _, v := range enum {
				if err := validate(flag, fmt.Sprint(v)); err != nil {
					t.Errorf("hotcount.%s: the schema offers %v, hotcount refuses it: %v", key, v, err)
				}
			}
			if err := validate(flag, "bogus"); err == nil {
				t.Errorf("hotcount.%s: hotcount takes bogus", key)
			}
			if err := render(key, "bogus"); err == nil || !strings.Contains(err.Error(), "/hotcount/"+key) {
				t.Errorf("hotcount.%s: bogus renders, or fails without naming the key: %v", key, err)
			}
		}
		if flags[flag] != nil && flags[flag].Value.Type() == "duration" {
			for _, v := range []string{"0", "1500ms", "1h30m", flags[flag].DefValue} {
				// The schema takes the form; a cross-field check
				// (TestHelmCrossChecks) may still refuse the value
				// against the other settings, naming it.
				if err := render(key, v); err != nil && (strings.Contains(err.Error(), "/hotcount/"+key) || !strings.Contains(err.Error(), "hotcount."+key)) {
					t.Errorf("hotcount.%s: duration %s does not render: %v", key, v, err)
				}
				if _, err := time.ParseDuration(v); err != nil {
					t.Fatal(err)
				}
			}
			for _, v := range []string{"1 s", "5", "-1s", "soon"} {
				if err := render(key, v); err == nil || !strings.Contains(err.Error(), "/hotcount/"+key) {
					t.Errorf("hotcount.%s: %q renders, or fails without naming the key: %v", key, v, err)
				}
			}
		}
	}
}

// TestHelmRejects: a wrong value fails at render, before anything reaches
// the cluster, with a message naming the key.
func TestHelmRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		dir  string
		vals string
		want []string
	}{
		{"negative shards", chartDir, "hotcount: {shards: -1}", []string{"/hotcount/shards", "minimum"}},
		{"unknown mode", chartDir, "hotcount: {natsMode: durable}", []string{"/hotcount/natsMode", "core", "jetstream", "partitioned"}},
		{"bad duration", chartDir, "hotcount: {flushInterval: 1 second}", []string{"/hotcount/flushInterval"}},
		{"unknown setting", chartDir, "hotcount: {flushIntervals: 1s}", []string{"flushIntervals"}},
		{"the token as a setting", chartDir, "hotcount: {natsToken: s3cret}", []string{"natsToken"}},
		{"a flag's name as a key", chartDir, "hotcount: {nats-url: 'nats://x:4222'}", []string{"nats-url"}},
		{"writable root", chartDir, "securityContext: {readOnlyRootFilesystem: false}", []string{"/securityContext/readOnlyRootFilesystem"}},
		{"root", chartDir, "podSecurityContext: {runAsNonRoot: false}", []string{"/podSecurityContext/runAsNonRoot"}},
		{"no memory limit", chartDir, "resources: {limits: {memory: null}}", []string{"/resources/limits", "memory"}},
		{"no CPU request", chartDir, "sidecar: {resources: {requests: {cpu: null}}}", []string{"/sidecar/resources/requests", "cpu"}},
		{"bad role", chartDir, "serviceAccount: {annotations: {eks.amazonaws.com/role-arn: hotcount-role}}", []string{"/serviceAccount/annotations/eks.amazonaws.com~1role-arn"}},
		{"unknown value", chartDir, "replicas: 3", []string{"replicas"}},
		{"negative replicas", chartDir, "replicaCount: -1", []string{"/replicaCount"}},
		{"open network policy", chartDir, "networkPolicy: {lookupFrom: [{}]}", []string{"/networkPolicy/lookupFrom/0"}},
		{"short token", chartDir, "lookupToken: {token: short}", []string{"lookupToken.token"}},
		{"setup without an account", chartDir, "setup: {table: {enabled: true}, serviceAccount: {create: false}}", []string{"setup.serviceAccount.name"}},
		{"admin on loopback", chartDir, "hotcount: {admin: '127.0.0.1:9091'}", []string{"hotcount.admin", "kubelet"}},
		{"pool on loopback", chartDir, "hotcount: {http: '127.0.0.1:8080'}", []string{"hotcount.http", "Service"}},
		{"sidecars' monitor without a selector", chartDir, "standalone: {enabled: false}\nmetrics: {podMonitor: {enabled: true}}", []string{"metrics.podMonitor.selector"}},
		{"root in the container", chartDir, "securityContext: {runAsUser: 0}", []string{"/securityContext/runAsUser", "minimum"}},
		{"runAsNonRoot off in the container", chartDir, "securityContext: {runAsNonRoot: false}", []string{"/securityContext/runAsNonRoot"}},
		{"unconfined container", chartDir, "securityContext: {seccompProfile: {type: Unconfined}}", []string{"/securityContext/seccompProfile/type"}},
		{"no pod seccomp profile", chartDir, "podSecurityContext: {seccompProfile: null}", []string{"/podSecurityContext", "seccompProfile"}},
		{"unconfined pod", chartDir, "podSecurityContext: {seccompProfile: {type: Unconfined}}", []string{"/podSecurityContext/seccompProfile/type"}},
		{"shutdown beyond the grace period", chartDir, "hotcount: {shutdownTimeout: 60s}", []string{"terminationGracePeriodSeconds", "hotcount.shutdownTimeout", "at least 65"}},
		{"sidecar's shutdown beyond the app's grace period", exampleDir, "hotcount: {hotcount: {shutdownTimeout: 60s}}", []string{"terminationGracePeriodSeconds", "hotcount.shutdownTimeout"}},
		{"admin on the lookup port", chartDir, "hotcount: {admin: ':8080'}", []string{"hotcount.admin", "hotcount.http", "same port"}},
		{"sidecar's admin on its lookup port", chartDir, "standalone: {enabled: false}\nhotcount: {admin: ':8080'}", []string{"hotcount.admin", "same port"}},
		{"stale shorter than the cache", chartDir, "hotcount: {cacheTtl: 10s, cacheStale: 5s}", []string{"hotcount.cacheStale", "cacheTtl"}},
		{"open sidecar", chartDir, "standalone: {enabled: false}\nhotcount: {http: ':8080'}", []string{"hotcount.http", "httpTokenFile"}},
		{"no time for the final flush", chartDir, "hotcount: {shutdownTimeout: 5s, drainTimeout: 5s}", []string{"hotcount.shutdownTimeout", "drainTimeout"}},
		{"setup without a memory limit", chartDir, "setup: {resources: {limits: {memory: null}}}", []string{"/setup/resources/limits", "memory"}},
		{"lookup from every namespace", chartDir, "networkPolicy: {lookupFrom: [{namespaceSelector: {}}]}", []string{"networkPolicy.lookupFrom[0]", "everyone"}},
		{"lookup from every pod", chartDir, "networkPolicy: {lookupFrom: [{podSelector: {}}]}", []string{"networkPolicy.lookupFrom[0]", "everyone"}},
		{"lookup from every pod of every namespace", chartDir, "networkPolicy: {lookupFrom: [{namespaceSelector: {matchLabels: {}}, podSelector: {matchExpressions: []}}]}", []string{"networkPolicy.lookupFrom[0]"}},
		{"lookup from every address", chartDir, "networkPolicy: {lookupFrom: [{podSelector: {matchLabels: {a: b}}}, {ipBlock: {cidr: 0.0.0.0/0}}]}", []string{"networkPolicy.lookupFrom[1]", "0.0.0.0/0"}},
		{"lookup from every IPv6 address", chartDir, "networkPolicy: {lookupFrom: [{ipBlock: {cidr: '::/0', except: ['10.0.0.0/8']}}]}", []string{"networkPolicy.lookupFrom[0]"}},
		{"metrics from every namespace", chartDir, "networkPolicy: {adminFrom: [{namespaceSelector: {}}]}", []string{"networkPolicy.adminFrom[0]"}},
		{"table create without a role", chartDir, "setup: {table: {enabled: true}}", []string{"setup.serviceAccount.annotations", "eks.amazonaws.com/role-arn"}},
		{"a setting in extraEnv", chartDir, "extraEnv: [{name: HOTCOUNT_HTTP_PUBLIC, value: 'true'}]", []string{"extraEnv[0]", "HOTCOUNT_HTTP_PUBLIC", "hotcount.httpPublic"}},
		{"through the app's chart", exampleDir, "hotcount: {hotcount: {shards: -1}}", []string{"hotcount:", "/hotcount/shards"}},
		{"sidecar of a pool", exampleDir, "hotcount: {standalone: {enabled: true}}", []string{"hotcount.standalone.enabled=false"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			vals, err := common.ReadValues([]byte(c.vals))
			if err != nil {
				t.Fatal(err)
			}
			_, _, _, _, err = helmTemplate(loadChart(t, c.dir), "hotcount", vals.AsMap())
			if err == nil {
				t.Fatalf("%s renders", c.vals)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: the error does not say %q:\n%v", c.vals, w, err)
				}
			}
			t.Logf("%s:\n%v", c.vals, err)
		})
	}
}

// TestHelmCrossChecks: the settings that pass the schema one by one but
// conflict (config.Validate's cross-field rules the chart mirrors) fail at
// render exactly when hotcount would refuse them at start, naming the same
// setting; hotcount's own defaults fill what the values leave out.
func TestHelmCrossChecks(t *testing.T) {
	defaults := readValues(t, filepath.Join(chartDir, "values.yaml"))
	ch := loadChart(t, chartDir)
	for _, c := range []struct {
		vals string
		key  string // the setting both name, when they refuse
	}{
		{"hotcount: {cacheStale: 500ms}", "cacheStale"},
		{"hotcount: {cacheStale: 1s}", ""},
		{"hotcount: {cacheStale: '0', cacheTtl: 1m}", ""},
		{"hotcount: {cacheTtl: 2s, cacheStale: 1500ms}", "cacheStale"},
		{"hotcount: {admin: ':8080'}", "admin"},
		{"hotcount: {admin: '0.0.0.0:8080'}", "admin"},
		{"hotcount: {admin: ':8081'}", ""},
		{"hotcount: {http: '10.0.0.1:9091'}", "admin"},
		{"standalone: {enabled: false}\nhotcount: {admin: ':8080'}", "admin"},
		{"standalone: {enabled: false}\nhotcount: {http: ':8080'}", "http"},
		{"standalone: {enabled: false}\nhotcount: {http: ':8080', httpPublic: true}", ""},
		{"standalone: {enabled: false}\nhotcount: {http: ':8080', httpTokenFile: /etc/token}", ""},
		{"hotcount: {httpPublic: true}", ""},
		{"hotcount: {shutdownTimeout: 5s}", "shutdownTimeout"},
		{"hotcount: {shutdownTimeout: 5500ms}", "shutdownTimeout"},
		{"hotcount: {shutdownTimeout: 6s}", ""},
		{"hotcount: {shutdownTimeout: 20s, drainTimeout: 19s}", "shutdownTimeout"},
		{"hotcount: {shutdownTimeout: 20s, drainTimeout: 18s}", ""},
		{"hotcount: {shutdownTimeout: 1m, drainTimeout: 1m}", "shutdownTimeout"},
	} {
		t.Run(c.vals, func(t *testing.T) {
			v, err := common.ReadValues([]byte(c.vals))
			if err != nil {
				t.Fatal(err)
			}
			vals := v.AsMap()
			_, _, _, _, chartErr := helmTemplate(ch, "hotcount", vals)
			// hotcount, with the settings the chart would give it.
			merged := chartvalues.MergeTables(vals, defaults)
			block, _ := merged["hotcount"].(map[string]any)
			env := map[string]string{}
			for k, v := range block {
				env[config.EnvPrefix+strings.ToUpper(strings.ReplaceAll(kebab(k), "-", "_"))] = valueString(v)
			}
			pool := dig(merged, "standalone", "enabled") != false
			if _, ok := block["http"]; !ok {
				env["HOTCOUNT_HTTP"] = map[bool]string{true: ":8080", false: "127.0.0.1:8080"}[pool]
			}
			_, file := block["httpTokenFile"]
			if pool && !file && block["httpPublic"] != true {
				env["HOTCOUNT_HTTP_TOKEN_FILE"] = "/var/run/secrets/hotcount/token"
			}
			var environ []string
			for k, v := range env {
				environ = append(environ, k+"="+v)
			}
			cfg := config.Default()
			if err := config.Parse(cfg.FlagSet("run", nil), nil, environ); err != nil {
				t.Fatal(err)
			}
			hcErr := cfg.Validate()
			switch {
			case (chartErr == nil) != (hcErr == nil):
				t.Errorf("the chart says %v, hotcount says %v", chartErr, hcErr)
			case c.key == "" && chartErr != nil:
				t.Errorf("both refuse what should pass: %v", chartErr)
			case c.key != "" && chartErr == nil:
				t.Errorf("both take what should fail on hotcount.%s", c.key)
			case c.key != "":
				if !strings.Contains(chartErr.Error(), "hotcount."+c.key) {
					t.Errorf("the chart's error does not name hotcount.%s: %v", c.key, chartErr)
				}
				if !strings.Contains(hcErr.Error(), kebab(c.key)) {
					t.Errorf("hotcount's error does not name %s: %v", kebab(c.key), hcErr)
				}
			}
		})
	}
}

// TestHelmSetupJobs runs the setup hooks' commands of
// ci/standalone-jetstream-values.yaml with the hotcount command (built as
// this test binary was, buildHotcount) as their containers would (the
// image's entrypoint is /hotcount: the args are its arguments), against a
// local NATS and dynalite instead of the cluster's: afterwards the table
// and the stream the pool uses exist.
func TestHelmSetupJobs(t *testing.T) {
	t.Parallel() // with the other two longest of deploy's tests: it runs last in make test, a core free
	vals := readValues(t, filepath.Join(chartDir, "ci", "standalone-jetstream-values.yaml"))
	r := renderChart(t, chartDir, "hotcount", vals)
	if len(r.jobs) != 2 {
		t.Fatalf("%d setup jobs, want table create and stream create", len(r.jobs))
	}
	cfg := checkPool(t, r.objects, "hotcount")
	bin := buildHotcount(t)
	d := testenv.StartDynalite(t)
	ns := testenv.NATS(t)
	for _, name := range slices.Sorted(maps.Keys(r.jobs)) {
		c := r.jobs[name].Spec.Template.Spec.Containers[0]
		env := []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true",
			"HOTCOUNT_DYNAMODB_ENDPOINT=" + d.Endpoint}
		for _, e := range jobEnv(c) {
			if strings.HasPrefix(e, "HOTCOUNT_NATS_URL=") {
				e = "HOTCOUNT_NATS_URL=" + ns.ClientURL()
			}
			env = append(env, e)
		}
		args := slices.Clone(c.Args)
		for i, a := range args {
			if strings.HasPrefix(a, "--replicas=") {
				args[i] = "--replicas=1" // one test server; the cluster has 3
			}
		}
		t.Logf("%s: %s", name, strings.TrimSpace(hotcount(t, bin, args, env)))
	}
	ctx := context.Background()
	if _, err := d.Client().DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &cfg.Table}); err != nil {
		t.Errorf("the pool's table %s does not exist after the jobs: %v", cfg.Table, err)
	}
	js, err := jetstream.New(testenv.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatalf("the pool's stream %s does not exist after the jobs: %v", cfg.Stream, err)
	}
	if info := st.CachedInfo().Config; !slices.Contains(info.Subjects, cfg.Subject) || info.MaxAge != 24*time.Hour {
		t.Errorf("stream %s takes %v for %s, want %s for 24h (setup.stream)", cfg.Stream, info.Subjects, info.MaxAge, cfg.Subject)
	}
}

// TestHelmTemplate is `helm template` for a new user's values, checked as
// the tests check the chart: with HOTCOUNT_CHART_VALUES set to values files
// (comma-separated, as helm -f takes them, later ones winning), it renders
// the chart with them, checks it as TestHelmRender does, and writes the
// manifests to HOTCOUNT_CHART_OUT (a file; none: the test log). Without it,
// ci/standalone-jetstream-values.yaml, which sets what a new user would:
// the table, the NATS URL, the mode and a memory limit.
//
//	HOTCOUNT_CHART_VALUES=$PWD/my-values.yaml HOTCOUNT_CHART_OUT=$PWD/chart.yaml \
//	  go test -count=1 -run '^TestHelmTemplate$' ./deploy/
func TestHelmTemplate(t *testing.T) {
	files := []string{filepath.Join(chartDir, "ci", "standalone-jetstream-values.yaml")}
	if v := os.Getenv("HOTCOUNT_CHART_VALUES"); v != "" {
		files = strings.Split(v, ",")
	}
	vals := map[string]any{}
	for _, f := range files {
		vals = chartvalues.MergeTables(readValues(t, f), vals)
	}
	c := chartCase{name: strings.Join(files, ","), vals: vals}
	c.classify()
	r := checkChartCase(t, c)
	if t.Failed() {
		return
	}
	out := os.Getenv("HOTCOUNT_CHART_OUT")
	if out == "" {
		t.Logf("%s\n%s", r.text, r.notes)
		return
	}
	if err := os.WriteFile(out, []byte(r.text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHelmReadmeValues: every value deploy/README.md's Helm section names
// is a key of values.yaml.
func TestHelmReadmeValues(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Helm\n")
	if !ok {
		t.Fatal("deploy/README.md has no Helm section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var vals map[string]any
	if err := yamlv3.Unmarshal(mustRead(t, filepath.Join(chartDir, "values.yaml")), &vals); err != nil {
		t.Fatal(err)
	}
	props := schemaProperties(t)
	n := 0
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		key, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
		path := strings.Split(key, ".")
		n++
		if dig(vals, path...) == nil && !(len(path) == 2 && path[0] == "hotcount" && schemaProperties(t, "hotcount")[path[1]] != nil) {
			t.Errorf("deploy/README.md names %s, which is not in values.yaml", key)
		}
		if props[path[0]] == nil {
			t.Errorf("deploy/README.md names %s, whose top key the schema lacks", key)
		}
	}
	if n < 10 {
		t.Errorf("the Helm section's table names %d values", n)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
