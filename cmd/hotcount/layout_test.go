package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// testTools is where the packages that exist for the tests live:
// harnesses, the DynamoDB fault emulator, the global table emulator, the
// OpenAPI checker. A new test tool goes there, and is covered at once.
const testTools = "github.com/hotcount/hotcount/internal/testtools/"

// TestProductionImportsNoTestTool: no package but a test tool depends on
// a test tool outside its tests, so the binary compiles none of them in
// (a fault emulator in production code is dead weight at best, and a
// switch left on at worst).
func TestProductionImportsNoTestTool(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{"\t"}}{{join .Deps " "}}`, "github.com/hotcount/hotcount/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	listed, tools := 0, 0
	for line := range strings.Lines(string(out)) {
		pkg, deps, _ := strings.Cut(strings.TrimSpace(line), "\t")
		listed++
		if strings.HasPrefix(pkg, testTools) {
			tools++
			continue
		}
		for dep := range strings.FieldsSeq(deps) {
			if strings.HasPrefix(dep, testTools) {
				t.Errorf("%s depends on the test tool %s", pkg, dep)
			}
		}
	}
	if listed < 20 || tools < 4 {
		t.Fatalf("go list named %d packages, %d of them test tools: not the module's", listed, tools)
	}
}

// TestWaitsAreNamed: every back-off between the tries of something that
// failed is one of internal/waits' policies, named for the kind of wait
// it is, not tuned again where it is used.
func TestWaitsAreNamed(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{"\t"}}{{.Dir}}{{"\t"}}{{join .GoFiles " "}}`, "github.com/hotcount/hotcount/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	// Ways to tune a back-off of one's own.
	tuned := []string{"backoff.NewExponentialBackOff(", "backoff.ExponentialBackOff{", "wait = min(2*wait"}
	files := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Split(strings.TrimSpace(line), "\t")
		if len(fields) < 3 || fields[0] == "github.com/hotcount/hotcount/internal/waits" {
			continue
		}
		for name := range strings.FieldsSeq(fields[2]) {
			src, err := os.ReadFile(filepath.Join(fields[1], name))
			if err != nil {
				t.Fatal(err)
			}
			files++
			for _, s := range tuned {
				if strings.Contains(string(src), s) {
					t.Errorf("%s: %s tunes a back-off of its own (%q): use one of internal/waits' policies", fields[0], name, s)
				}
			}
		}
	}
	if files < 100 {
		t.Fatalf("read %d files: not the module's", files)
	}
}
