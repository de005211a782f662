package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestDemoCommand runs make demo's command line, shortened: it starts
// dynalite itself and writes the chart into a folder that does not exist
// yet. Without a DynamoDB API, or with two, it is a usage error.
func TestDemoCommand(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		out  string
	}{
		{"no endpoint", []string{"demo"}, "demo needs --dynalite"},
		{"two endpoints", []string{"demo", "--dynalite", "dynalite", "--dynamodb-endpoint", "http://127.0.0.1:1"}, "not both"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := dispatch(context.Background(), tt.args, nil, &stdout, &stderr)
			if code := exitCode(err, &stderr); code != exitUsage || !strings.Contains(stderr.String(), tt.out) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr.String(), exitUsage, tt.out)
			}
		})
	}

	t.Run("make demo", func(t *testing.T) {
		testenv.AWSEnv(t)
		svg := filepath.Join(t.TempDir(), "build", "demo.svg")
		var stdout, stderr bytes.Buffer
		args := []string{"demo", "--dynalite", testenv.DynaliteBinary(t), "--svg", svg, "--duration", "200ms", "--writers", "4"}
		if err := dispatch(context.Background(), args, nil, &stdout, &stderr); err != nil {
			t.Fatalf("%v\n%s", err, stderr.String())
		}
		for _, want := range []string{"N=1 direct", "N=8 coalesced", "chart: " + svg} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, stdout.String())
			}
		}
		if b, err := os.ReadFile(svg); err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
			t.Errorf("no chart at %s: %v", svg, err)
		}
	})
}
