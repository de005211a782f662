package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// testTools are the packages that exist for the tests: harnesses, the
// DynamoDB fault emulator, the global table emulator, the OpenAPI checker.
var testTools = []string{
	"github.com/hotcount/hotcount/internal/testenv",
	"github.com/hotcount/hotcount/internal/testenv/sidecartest",
	"github.com/hotcount/hotcount/internal/ddbfault",
	"github.com/hotcount/hotcount/internal/globaltable",
	"github.com/hotcount/hotcount/internal/apitest",
}

// TestProductionImportsNoTestTool: no package but a test tool depends on
// a test tool outside its tests, so the binary compiles none of them in
// (a fault emulator in production code is dead weight at best, and a
// switch left on at worst).
func TestProductionImportsNoTestTool(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{"\t"}}{{join .Deps " "}}`, "github.com/hotcount/hotcount/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	listed := 0
	for line := range strings.Lines(string(out)) {
		pkg, deps, _ := strings.Cut(strings.TrimSpace(line), "\t")
		listed++
		if slices.Contains(testTools, pkg) {
			continue
		}
		for dep := range strings.FieldsSeq(deps) {
			if slices.Contains(testTools, dep) {
				t.Errorf("%s depends on the test tool %s", pkg, dep)
			}
		}
	}
	if listed < 20 {
		t.Fatalf("go list named %d packages: not the module's", listed)
	}
}
