package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	yamlv3 "go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// objects is a rendered kustomization, decoded strictly into the real
// Kubernetes types: an unknown or misspelt field fails the decode.
type objects struct {
	deployments     map[string]appsv1.Deployment
	configMaps      map[string]corev1.ConfigMap
	serviceAccounts map[string]corev1.ServiceAccount
	services        map[string]corev1.Service
	pdbs            map[string]policyv1.PodDisruptionBudget
	netpols         map[string]networkingv1.NetworkPolicy
}

func render(t *testing.T, dir string) objects {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	o := newObjects()
	for _, r := range rm.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		if kind, ok := o.add(t, doc); !ok {
			t.Errorf("unexpected kind %s", kind)
		}
	}
	return o
}

// file decodes doc (what, in errors) strictly into a T and files it in
// into under its name.
func file[T any, P interface {
	*T
	GetName() string
}](t *testing.T, doc []byte, what string, into map[string]T) {
	t.Helper()
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		t.Fatalf("%s does not decode strictly: %v", what, err)
	}
	into[P(&v).GetName()] = v
}

func newObjects() objects {
	return objects{
		deployments: map[string]appsv1.Deployment{}, configMaps: map[string]corev1.ConfigMap{},
		serviceAccounts: map[string]corev1.ServiceAccount{}, services: map[string]corev1.Service{},
		pdbs: map[string]policyv1.PodDisruptionBudget{}, netpols: map[string]networkingv1.NetworkPolicy{},
	}
}

// add decodes doc strictly into its kind's type and files it under its
// name; ok is false, and nothing is filed, for a kind objects has no place
// for.
func (o objects) add(t *testing.T, doc []byte) (kind string, ok bool) {
	t.Helper()
	var tm struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        struct{ Name string } `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		t.Fatal(err)
	}
	what := tm.Kind + " " + tm.Metadata.Name
	switch tm.Kind {
	case "Deployment":
		file(t, doc, what, o.deployments)
	case "ConfigMap":
		file(t, doc, what, o.configMaps)
	case "ServiceAccount":
		file(t, doc, what, o.serviceAccounts)
	case "Service":
		file(t, doc, what, o.services)
	case "PodDisruptionBudget":
		file(t, doc, what, o.pdbs)
	case "NetworkPolicy":
		file(t, doc, what, o.netpols)
	default:
		return tm.Kind, false
	}
	return tm.Kind, true
}

// checkHotcount asserts the invariants of a hotcount container and its pod,
// and returns the settings it runs with.
func checkHotcount(t *testing.T, o objects, pod corev1.PodSpec, c corev1.Container) config.Config {
	t.Helper()
	if !strings.HasPrefix(c.Image, "hotcount") && !strings.Contains(c.Image, "/hotcount") {
		t.Errorf("image %q is not hotcount's", c.Image)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "admin" {
			t.Errorf("%s probe = %+v, want GET %s on port admin", p.name, p.probe, p.path)
		}
	}
	admin := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "admin" })
	if admin < 0 || c.Ports[admin].ContainerPort != 9091 {
		t.Errorf("no admin port 9091: %+v", c.Ports)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
	}
	// Every container of the pod, the app's too: what runs in it runs as
	// the pod's user unless the container says otherwise.
	for _, pc := range slices.Concat(pod.InitContainers, pod.Containers) {
		if err := lockedDown(pod.SecurityContext, pc); err != nil {
			t.Errorf("container %s: %v", pc.Name, err)
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, config.EnvPrefix) && e.Name != config.EnvPrefix+"NATS_TOKEN" {
			t.Errorf("env %s overrides the settings' ConfigMap", e.Name)
		}
	}

	// The settings are the ConfigMap's, through envFrom: hotcount must
	// accept them as `hotcount check-config` does.
	var environ []string
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		cm, ok := o.configMaps[ef.ConfigMapRef.Name]
		if !ok {
			t.Fatalf("envFrom names ConfigMap %q, which is not rendered", ef.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			environ = append(environ, k+"="+v)
		}
	}
	if len(environ) == 0 {
		t.Fatal("no settings from a ConfigMap")
	}
	for _, e := range c.Env {
		environ = append(environ, e.Name+"="+e.Value)
	}
	cfg := config.Default()
	if err := config.Parse(cfg.FlagSet("run", nil), c.Args[1:], environ); err != nil {
		t.Fatalf("settings rejected: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("settings invalid: %v", err)
	}
	if c.Args[0] != "run" {
		t.Errorf("args %v, want run", c.Args)
	}

	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	if grace < cfg.ShutdownTimeout+5*time.Second {
		t.Errorf("grace period %s does not cover the shutdown budget %s plus 5 s", grace, cfg.ShutdownTimeout)
	}
	sa, ok := o.serviceAccounts[pod.ServiceAccountName]
	if !ok || !strings.HasPrefix(sa.Annotations["eks.amazonaws.com/role-arn"], "arn:aws:iam::") {
		t.Errorf("service account %q lacks an IRSA role annotation: %+v", pod.ServiceAccountName, sa.Annotations)
	}
	return cfg
}

// lockedDown says why container c of a pod with security context psc is
// not locked down, or nil: it runs as non-root under a confining seccomp
// profile, the container's settings winning over the pod's as the kubelet
// applies them, with a read-only root, without privilege escalation, every
// capability dropped.
func lockedDown(psc *corev1.PodSecurityContext, c corev1.Container) error {
	sc := c.SecurityContext
	if sc == nil {
		return fmt.Errorf("no securityContext")
	}
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	nonRoot, user, seccomp := psc.RunAsNonRoot, psc.RunAsUser, psc.SeccompProfile
	if sc.RunAsNonRoot != nil {
		nonRoot = sc.RunAsNonRoot
	}
	if sc.RunAsUser != nil {
		user = sc.RunAsUser
	}
	if sc.SeccompProfile != nil {
		seccomp = sc.SeccompProfile
	}
	switch {
	case nonRoot == nil || !*nonRoot:
		return fmt.Errorf("runAsNonRoot is not true")
	case user != nil && *user == 0:
		return fmt.Errorf("runs as root (runAsUser 0)")
	case seccomp == nil || (seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost):
		return fmt.Errorf("seccomp profile %+v is not RuntimeDefault or Localhost", seccomp)
	case sc.Privileged != nil && *sc.Privileged:
		return fmt.Errorf("privileged")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		return fmt.Errorf("root filesystem is writable")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		return fmt.Errorf("privilege escalation is allowed")
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
		return fmt.Errorf("capabilities are not all dropped")
	}
	return nil
}

// TestLockedDown: the container's settings win over the pod's, as the
// kubelet applies them.
func TestLockedDown(t *testing.T) {
	yes, no := true, false
	root, user := int64(0), int64(65532)
	pod := func() *corev1.PodSecurityContext {
		return &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &user,
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	}
	ctr := func(edit func(*corev1.SecurityContext)) corev1.Container {
		sc := &corev1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
		edit(sc)
		return corev1.Container{Name: "hotcount", SecurityContext: sc}
	}
	for _, c := range []struct {
		name string
		psc  *corev1.PodSecurityContext
		c    corev1.Container
		ok   bool
	}{
		{"locked down", pod(), ctr(func(*corev1.SecurityContext) {}), true},
		{"the container's user", pod(), ctr(func(sc *corev1.SecurityContext) { sc.RunAsUser = &user }), true},
		{"root in the container", pod(), ctr(func(sc *corev1.SecurityContext) { sc.RunAsUser = &root }), false},
		{"runAsNonRoot off in the container", pod(), ctr(func(sc *corev1.SecurityContext) { sc.RunAsNonRoot = &no }), false},
		{"runAsNonRoot on in the container only", &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			ctr(func(sc *corev1.SecurityContext) { sc.RunAsNonRoot = &yes }), true},
		{"unconfined in the container", pod(), ctr(func(sc *corev1.SecurityContext) {
			sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}), false},
		{"no seccomp profile", &corev1.PodSecurityContext{RunAsNonRoot: &yes}, ctr(func(*corev1.SecurityContext) {}), false},
		{"a capability added", pod(), ctr(func(sc *corev1.SecurityContext) { sc.Capabilities.Add = []corev1.Capability{"NET_ADMIN"} }), false},
		{"privileged", pod(), ctr(func(sc *corev1.SecurityContext) { sc.Privileged = &yes }), false},
	} {
		if err := lockedDown(c.psc, c.c); (err == nil) != c.ok {
			t.Errorf("%s: lockedDown = %v, want ok %v", c.name, err, c.ok)
		}
	}
}

// openPeer says whether a NetworkPolicy peer admits everyone: only empty
// selectors (every pod of the namespace, or of every namespace), or an
// ipBlock of every address.
func openPeer(p networkingv1.NetworkPolicyPeer) bool {
	if p.IPBlock != nil {
		return strings.HasSuffix(p.IPBlock.CIDR, "/0")
	}
	narrow := func(s *metav1.LabelSelector) bool {
		return s != nil && (len(s.MatchLabels) > 0 || len(s.MatchExpressions) > 0)
	}
	return !narrow(p.PodSelector) && !narrow(p.NamespaceSelector)
}

// TestOpenPeer: what openPeer calls open.
func TestOpenPeer(t *testing.T) {
	labels := &metav1.LabelSelector{MatchLabels: map[string]string{"hotcount.io/client": "true"}}
	for _, c := range []struct {
		name string
		p    networkingv1.NetworkPolicyPeer
		open bool
	}{
		{"labelled pods of every namespace", networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: labels}, false},
		{"labelled namespaces", networkingv1.NetworkPolicyPeer{NamespaceSelector: labels}, false},
		{"every namespace", networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}}, true},
		{"every pod of the namespace", networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{}}, true},
		{"every pod of every namespace", networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{}}, true},
		{"every IPv4 address", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}, true},
		{"every IPv6 address", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "::/0"}}, true},
		{"a subnet", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16"}}, false},
	} {
		if got := openPeer(c.p); got != c.open {
			t.Errorf("%s: openPeer = %v, want %v", c.name, got, c.open)
		}
	}
}

// TestSidecar renders the base and the example overlay: hotcount is a native
// sidecar of the app, and every invariant holds.
func TestSidecar(t *testing.T) {
	for _, dir := range []string{"kubernetes/base", "kubernetes/overlays/example"} {
		t.Run(dir, func(t *testing.T) {
			o := render(t, dir)
			hc, cfg := checkSidecar(t, o, "trends-api")
			svc := o.services["trends-api-hotcount-metrics"]
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "admin" {
				t.Errorf("metrics service ports %+v", svc.Spec.Ports)
			}
			if pdb, ok := o.pdbs["trends-api"]; !ok || pdb.Spec.MaxUnavailable == nil {
				t.Error("no PodDisruptionBudget")
			}
			if dir == "kubernetes/overlays/example" && (cfg.Table != "trends-hotcount" || cfg.Shards != 8 || !strings.HasPrefix(hc.Image, "your-registry/hotcount:")) {
				t.Errorf("overlay not applied: table %s, shards %d, image %s", cfg.Table, cfg.Shards, hc.Image)
			}
		})
	}
}

// checkSidecar asserts that Deployment name runs hotcount as a native
// sidecar of its app, with every invariant of checkHotcount and the lookup
// API on loopback, and returns the container and its settings.
func checkSidecar(t *testing.T, o objects, name string) (corev1.Container, config.Config) {
	t.Helper()
	d, ok := o.deployments[name]
	if !ok {
		t.Fatalf("no %s Deployment", name)
	}
	pod := d.Spec.Template.Spec
	i := slices.IndexFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == "hotcount" })
	if i < 0 {
		t.Fatal("hotcount is not an init container")
	}
	hc := pod.InitContainers[i]
	if hc.RestartPolicy == nil || *hc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("hotcount is not a native sidecar (restartPolicy: Always)")
	}
	if hc.StartupProbe == nil {
		t.Error("no startup probe: the app would start before hotcount is up")
	}
	cfg := checkHotcount(t, o, pod, hc)
	if !strings.HasPrefix(cfg.HTTPAddr, "127.0.0.1:") {
		t.Errorf("lookup API on %s: a sidecar's is for its own pod only", cfg.HTTPAddr)
	}
	if len(pod.Containers) == 0 {
		t.Error("no application container")
	}
	return hc, cfg
}

// TestStandalone renders the pool variant: one Deployment of hotcount, the
// lookup API behind a Service.
func TestStandalone(t *testing.T) {
	checkPool(t, render(t, "kubernetes/standalone"), "hotcount")
}

// checkPool asserts that Deployment name is a pool of hotcount with every
// invariant of checkHotcount, its lookup API behind Service name, a token
// it can read, and NetworkPolicy name admitting only labelled clients; it
// returns the pool's settings.
func checkPool(t *testing.T, o objects, name string) config.Config {
	t.Helper()
	d, ok := o.deployments[name]
	if !ok || len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("no %s Deployment with one container", name)
	}
	cfg := checkHotcount(t, o, d.Spec.Template.Spec, d.Spec.Template.Spec.Containers[0])
	if strings.HasPrefix(cfg.HTTPAddr, "127.0.0.1:") {
		t.Errorf("a pool's lookup API on %s is unreachable through its Service", cfg.HTTPAddr)
	}
	if _, ok := o.services[name]; !ok {
		t.Error("no Service for the pool")
	}
	// Reachable beyond the pod: a token, and a NetworkPolicy that admits
	// only labelled clients to the lookup port.
	if cfg.HTTPTokenFile == "" || cfg.HTTPPublic {
		t.Errorf("pool lookup API without a token (token file %q, public %v)", cfg.HTTPTokenFile, cfg.HTTPPublic)
	}
	mounted := false
	for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
		if strings.HasPrefix(cfg.HTTPTokenFile, m.MountPath+"/") {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("the token file %s is on no mounted volume", cfg.HTTPTokenFile)
	}
	// Secret files belong to root: the non-root user reads the token
	// through fsGroup and a group-readable mode, or not at all.
	psc := d.Spec.Template.Spec.SecurityContext
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		mode := int32(0o644)
		if v.Secret.DefaultMode != nil {
			mode = *v.Secret.DefaultMode
		}
		if psc.FSGroup == nil || psc.RunAsUser == nil || *psc.FSGroup != *psc.RunAsUser || mode&0o040 == 0 {
			t.Errorf("secret volume %s (mode %o, fsGroup %v) is not readable by user %v", v.Name, mode, psc.FSGroup, psc.RunAsUser)
		}
	}
	np, ok := o.netpols[name]
	if !ok {
		t.Fatal("no NetworkPolicy for the pool")
	}
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "hotcount" || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy selects %v for %v, want hotcount's pods, ingress", np.Spec.PodSelector.MatchLabels, np.Spec.PolicyTypes)
	}
	for _, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 {
			t.Errorf("an ingress rule admits anyone: %+v", rule)
		}
		for _, peer := range rule.From {
			if openPeer(peer) {
				t.Errorf("an ingress rule admits everyone: %+v", rule)
			}
		}
	}
	return cfg
}

type policy struct {
	Version   string
	Statement []struct {
		Sid      string
		Effect   string
		Action   []string
		Resource string
	}
}

func readPolicy(t *testing.T, path string) policy {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var p policy
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return p
}

// TestIAMPolicies: the policies allow exactly the DynamoDB calls the code
// makes (the methods of store.DynamoAPI, the one interface every call goes
// through, and of store.TTLAPI, table create's), on the table only; the
// sidecar's cannot create tables.
func TestIAMPolicies(t *testing.T) {
	calls := map[string]bool{}
	for _, api := range []reflect.Type{reflect.TypeFor[store.DynamoAPI](), reflect.TypeFor[store.TTLAPI]()} {
		for i := range api.NumMethod() {
			calls["dynamodb:"+api.Method(i).Name] = true
		}
	}
	granted := map[string]bool{}
	for _, f := range []string{"iam/policy.json", "iam/policy-admin.json"} {
		p := readPolicy(t, f)
		for _, s := range p.Statement {
			if s.Effect != "Allow" || !strings.HasSuffix(s.Resource, ":table/hotcount") || strings.Contains(s.Resource, "*") {
				t.Errorf("%s: statement %s: %s on %s, want Allow on the table's ARN only", f, s.Sid, s.Effect, s.Resource)
			}
			for _, a := range s.Action {
				if !calls[a] {
					t.Errorf("%s allows %s, which the code never calls", f, a)
				}
				if f == "iam/policy.json" && a == "dynamodb:CreateTable" {
					t.Errorf("the sidecar's policy allows CreateTable")
				}
				granted[a] = true
			}
		}
	}
	for c := range calls {
		if !granted[c] {
			t.Errorf("the code calls %s, which no policy allows", c)
		}
	}
}

// TestStreamDefinition: the stream file decodes strictly as a JetStream
// stream configuration and a NATS server accepts it.
func TestStreamDefinition(t *testing.T) {
	b, err := os.ReadFile("nats/stream.json")
	if err != nil {
		t.Fatal(err)
	}
	var sc jetstream.StreamConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		t.Fatalf("stream.json: %v", err)
	}
	cfg := config.Default()
	if sc.Name != cfg.Stream || !slices.Equal(sc.Subjects, []string{cfg.Subject}) || sc.Storage != jetstream.FileStorage || sc.Duplicates <= 0 {
		t.Errorf("stream %+v: want %s on %s, file storage, a duplicate window", sc, cfg.Stream, cfg.Subject)
	}
	// A server whose file store may hold the stream's max_bytes (10 GiB)
	// whatever this machine's free disk: by default JetStream takes 75% of
	// it, and refused the stream on a machine with 13 GB free.
	ns := testenv.NATSWith(t, &natsserver.Options{Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: 1 << 40})
	js, err := jetstream.New(testenv.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	sc.Replicas = 1 // one test server; production runs 3
	if _, err := js.CreateStream(context.Background(), sc); err != nil {
		t.Fatalf("NATS refuses the stream: %v", err)
	}
}

// TestTableTemplate: the CloudFormation table has pk as its only (HASH) key,
// on-demand billing, point-in-time recovery, and TTL on the buckets'
// expiry.
func TestTableTemplate(t *testing.T) {
	b, err := os.ReadFile("table/cloudformation.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tmpl struct {
		Resources map[string]struct {
			Type       string `yaml:"Type"`
			Properties struct {
				AttributeDefinitions []struct {
					Name string `yaml:"AttributeName"`
					Type string `yaml:"AttributeType"`
				} `yaml:"AttributeDefinitions"`
				KeySchema []struct {
					Name string `yaml:"AttributeName"`
					Type string `yaml:"KeyType"`
				} `yaml:"KeySchema"`
				BillingMode string `yaml:"BillingMode"`
				PITR        struct {
					Enabled bool `yaml:"PointInTimeRecoveryEnabled"`
				} `yaml:"PointInTimeRecoverySpecification"`
				TTL struct {
					Name    string `yaml:"AttributeName"`
					Enabled bool   `yaml:"Enabled"`
				} `yaml:"TimeToLiveSpecification"`
			} `yaml:"Properties"`
		} `yaml:"Resources"`
	}
	if err := yamlv3.Unmarshal(b, &tmpl); err != nil {
		t.Fatal(err)
	}
	table := tmpl.Resources["Table"]
	p := table.Properties
	if table.Type != "AWS::DynamoDB::Table" || len(p.KeySchema) != 1 || p.KeySchema[0].Name != schema.AttrPK || p.KeySchema[0].Type != "HASH" {
		t.Errorf("key schema %+v, want %s HASH only", p.KeySchema, schema.AttrPK)
	}
	if len(p.AttributeDefinitions) != 1 || p.AttributeDefinitions[0].Name != schema.AttrPK || p.AttributeDefinitions[0].Type != "S" {
		t.Errorf("attributes %+v, want pk of type S only", p.AttributeDefinitions)
	}
	if p.BillingMode != "PAY_PER_REQUEST" || !p.PITR.Enabled {
		t.Errorf("billing %s, PITR %v: want on-demand with point-in-time recovery", p.BillingMode, p.PITR.Enabled)
	}
	if p.TTL.Name != schema.AttrExpiresAt || !p.TTL.Enabled {
		t.Errorf("TTL %+v, want enabled on %s (time buckets expire)", p.TTL, schema.AttrExpiresAt)
	}
}

// TestDockerfile checks what the image promises, as far as a file can say:
// a static, trimmed, version-stamped build, an empty final base, a non-root
// numeric user.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	var user string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "FROM":
			froms = append(froms, f[1])
		case "USER":
			user = f[1]
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=", "ca-certificates.crt", "./cmd/hotcount"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("Dockerfile lacks %s", want)
		}
	}
	if len(froms) < 2 || froms[len(froms)-1] != "scratch" {
		t.Errorf("stages %v: want a build stage and a final scratch stage", froms)
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := fmt.Sscan(uid, new(int)); n != 1 || err != nil || uid == "0" {
		t.Errorf("USER %q: want a numeric non-root user", user)
	}
}
