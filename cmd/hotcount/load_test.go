package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// TestLoadHelp: --subject says load publishes under it, and --seed shows
// no random default.
func TestLoadHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := dispatch(context.Background(), []string{"load", "--help"}, nil, &stdout, &stderr); exitCode(err, &stderr) != exitOK {
		t.Fatalf("load --help: %v", err)
	}
	help := stdout.String() + stderr.String()
	for _, line := range strings.Split(help, "\n") {
		switch {
		case strings.Contains(line, "--subject "):
			if !strings.Contains(line, "prefix to publish to") || strings.Contains(line, "subscribe") || !strings.Contains(line, "$HOTCOUNT_SUBJECT") {
				t.Errorf("--subject help: %s", line)
			}
		case strings.Contains(line, "--seed "):
			if strings.Contains(line, "default") || !strings.Contains(line, "0 picks one at random") {
				t.Errorf("--seed help: %s", line)
			}
		}
	}
}

// TestLoadCoreReportsWhatTheServerReceived: with --jetstream false the
// report is what the NATS server received, which a subscriber that keeps
// up gets exactly; load warns that core subscribers may drop; the seed it
// prints repeats the run.
func TestLoadCoreReportsWhatTheServerReceived(t *testing.T) {
	ns := testenv.NATS(t)
	tally := testenv.NewTally(t, ns.ClientURL(), "mentions.>", "mentions.")
	load := func(args ...string) (loadgen.Report, string) {
		t.Helper()
		report := filepath.Join(t.TempDir(), "sent.json")
		var stdout, stderr bytes.Buffer
		args = append([]string{"load", "--nats-url", ns.ClientURL(), "--jetstream", "false", "--topics", "20",
			"--messages", "2000", "--duration", "0", "--count", "3", "--report", report}, args...)
		if err := dispatch(context.Background(), args, nil, &stdout, &stderr); err != nil {
			t.Fatalf("load: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stdout.String(), "received by the NATS server") || !strings.Contains(stderr.String(), "at-most-once") {
			t.Errorf("load in core NATS did not say what it counts and what may drop:\n%s%s", stdout.String(), stderr.String())
		}
		raw, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		var rep loadgen.Report
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatal(err)
		}
		return rep, stdout.String()
	}
	first, out := load()
	if first.Messages != 2000 || first.Mentions != 6000 {
		t.Fatalf("report: %d messages, %d mentions; want 2000, 6000", first.Messages, first.Mentions)
	}
	testenv.Eventually(t, 10*time.Second, func() error { return tally.Is(first.PerTopic) })
	seed := regexp.MustCompile(`seed (\d+)`).FindStringSubmatch(out)
	if seed == nil {
		t.Fatalf("load printed no seed:\n%s", out)
	}
	again, _ := load("--seed", seed[1])
	if fmt.Sprint(again.PerTopic) != fmt.Sprint(first.PerTopic) {
		t.Errorf("--seed %s: %v, the first run %v", seed[1], again.PerTopic, first.PerTopic)
	}
}
