package layers_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/hotcount/hotcount/"

// golist runs `go list` from the module's root with args, one line a
// package.
func golist(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.Fields(string(out))
}

// nonStandard lists what pkg compiles that is not the standard library.
func nonStandard(t *testing.T, pkg string) []string {
	return golist(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg)
}

// TestClientNeedsOnlyNATS: a producer that imports client compiles
// nats.go (and what nats.go needs), one back-off library and the wire
// packages, none of the sidecar: no AWS SDK, bbolt, otter, Prometheus or
// zap.
func TestClientNeedsOnlyNATS(t *testing.T) {
	allowed := map[string]bool{"github.com/cenkalti/backoff/v5": true}
	for _, p := range nonStandard(t, "github.com/nats-io/nats.go/jetstream") {
		allowed[p] = true
	}
	for _, p := range []string{"client", "api", "mention", "internal/waits"} {
		allowed[module+p] = true
	}
	for _, p := range nonStandard(t, "./client") {
		if !allowed[p] {
			t.Errorf("client compiles %s", p)
		}
	}
}

// TestWirePackagesAreStandardOnly: the wire types (api), the mention's
// format and rules (mention) and the key schema (schema) need only the
// standard library.
func TestWirePackagesAreStandardOnly(t *testing.T) {
	for _, pkg := range []string{"./api", "./mention", "./schema"} {
		for _, p := range nonStandard(t, pkg) {
			// The key schema checks topics by mention's rules.
			if p != module+strings.TrimPrefix(pkg, "./") && !(pkg == "./schema" && p == module+"mention") {
				t.Errorf("%s compiles %s", pkg, p)
			}
		}
	}
}

// TestSchemaAndConfigNeedNoServer: the key schema (schema) and the
// settings (config) name counters and read settings without compiling the
// AWS SDK, bbolt, otter, Prometheus or zap: the adapters and the stages
// that need them import them, not the packages every tool reads.
func TestSchemaAndConfigNeedNoServer(t *testing.T) {
	heavy := []string{"github.com/aws/", "go.etcd.io/bbolt", "github.com/maypok86/otter", "github.com/prometheus/", "go.uber.org/zap"}
	for _, pkg := range []string{"./schema", "./config"} {
		for _, p := range nonStandard(t, pkg) {
			if slices.ContainsFunc(heavy, func(h string) bool { return strings.HasPrefix(p, h) }) {
				t.Errorf("%s compiles %s", pkg, p)
			}
			if strings.HasPrefix(p, module+"pipeline/") || strings.HasPrefix(p, module+"durability/") {
				t.Errorf("%s compiles the stage %s", pkg, p)
			}
		}
	}
}

// TestPipelineNeverImportsDurability: the stages under pipeline/ are what
// every mode runs; the durable modes build on them, never the other way.
// Nothing a stage compiles reaches durability/, however indirectly; its
// tests import no durability/ package themselves (they may through the
// test tools, which start the durable modes' streams).
func TestPipelineNeverImportsDurability(t *testing.T) {
	pkgs := golist(t, "./pipeline/...")
	if !slices.Contains(pkgs, module+"pipeline/ingest") {
		t.Fatalf("go list ./pipeline/... lacks pipeline/ingest: %v", pkgs)
	}
	for _, pkg := range pkgs {
		for _, dep := range nonStandard(t, pkg) {
			if strings.HasPrefix(dep, module+"durability/") {
				t.Errorf("%s compiles %s", pkg, dep)
			}
		}
	}
	for _, l := range golist(t, "-f", "{{.ImportPath}}:{{join .TestImports \",\"}},{{join .XTestImports \",\"}}", "./pipeline/...") {
		pkg, imports, _ := strings.Cut(l, ":")
		for _, imp := range strings.Split(imports, ",") {
			if strings.HasPrefix(imp, module+"durability/") {
				t.Errorf("%s's tests import %s", pkg, imp)
			}
		}
	}
}
