package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats.go/jetstream"
	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestCompose checks the repository's compose.yaml, which the development
// machines cannot run (no Docker engine), for what would break a user who
// runs it: compose-go must load it as `docker compose` would; every hotcount
// service must be built from deploy/Dockerfile and its settings accepted by
// the real CLI (`hotcount check-config`, on the service's own command line
// and environment); the sidecars run in JetStream mode, agree on the table
// and stream, reach NATS and DynamoDB by service name, publish their ports
// on localhost without clashes and start only after the setup jobs; and the
// setup jobs, run against a local NATS and dynalite, create what the
// sidecars use.
func TestCompose(t *testing.T) {
	t.Parallel() // with the other two longest of deploy's tests: it runs last in make test, a core free
	p := loadCompose(t)
	bin := buildHotcount(t)

	dockerfile, err := filepath.Abs("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	checkEntrypoint(t, dockerfile)
	var sidecars, jobs []types.ServiceConfig
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if s.Build == nil {
			continue
		}
		if got := filepath.Join(s.Build.Context, s.Build.Dockerfile); got != dockerfile {
			t.Errorf("%s: builds %s, want %s", name, got, dockerfile)
		}
		// The Dockerfile copies go.mod and ./cmd/hotcount from its context.
		for _, f := range []string{"go.mod", "cmd/hotcount"} {
			if _, err := os.Stat(filepath.Join(s.Build.Context, f)); err != nil {
				t.Errorf("%s: build context %s is not the module root: %v", name, s.Build.Context, err)
			}
		}
		if len(s.Entrypoint) > 0 {
			t.Errorf("%s: entrypoint %v replaces the image's /hotcount", name, s.Entrypoint)
		}
		switch {
		case runs(s, "run"):
			sidecars = append(sidecars, s)
		case runs(s, "table create"), runs(s, "stream create"):
			jobs = append(jobs, s)
		default:
			t.Fatalf("%s: command %v is neither `run` nor a setup job", name, s.Command)
		}
	}
	if len(sidecars) < 2 {
		t.Fatalf("%d sidecars, want two sharing the stream", len(sidecars))
	}
	for _, want := range []string{"table create", "stream create"} {
		if !slices.ContainsFunc(jobs, func(s types.ServiceConfig) bool { return runs(s, want) }) {
			t.Errorf("no service runs `hotcount %s`", want)
		}
	}

	// The sidecars' effective settings, as the real CLI prints them.
	var settings []map[string]string
	for _, s := range sidecars {
		out := hotcount(t, bin, append([]string{"check-config"}, s.Command[1:]...), environ(s))
		var set map[string]string
		if err := yamlv3.Unmarshal([]byte(out), &set); err != nil {
			t.Fatalf("%s: check-config printed %q: %v", s.Name, out, err)
		}
		settings = append(settings, set)

		if set["nats-mode"] != "jetstream" {
			t.Errorf("%s: nats-mode %s, want jetstream (sidecars sharing a stream)", s.Name, set["nats-mode"])
		}
		for _, listener := range []string{"http", "admin"} {
			_, port, err := net.SplitHostPort(set[listener])
			if err != nil {
				t.Fatalf("%s: --%s %q: %v", s.Name, listener, set[listener], err)
			}
			i := slices.IndexFunc(s.Ports, func(p types.ServicePortConfig) bool { return strconv.Itoa(int(p.Target)) == port })
			switch {
			case i < 0:
				t.Errorf("%s: --%s listens on port %s, which is not published", s.Name, listener, port)
			case s.Ports[i].HostIP != "127.0.0.1":
				// The lookup API runs without a token (--http-public).
				t.Errorf("%s: port %s is published on %q, want 127.0.0.1 only", s.Name, port, s.Ports[i].HostIP)
			}
		}
		for _, j := range jobs {
			if d, ok := s.DependsOn[j.Name]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
				t.Errorf("%s: depends on %s with %+v, want condition %s", s.Name, j.Name, d, types.ServiceConditionCompletedSuccessfully)
			}
		}
	}
	first := settings[0]
	for i, set := range settings[1:] {
		for _, k := range []string{"nats-url", "dynamodb-endpoint", "table", "stream", "subject"} {
			if set[k] != first[k] {
				t.Errorf("%s: %s %q, but %s has %q", sidecars[i+1].Name, k, set[k], sidecars[0].Name, first[k])
			}
		}
	}

	// NATS and DynamoDB are services of the project, reached by name, and
	// each setup job waits until the one it needs is healthy.
	for _, dep := range []struct{ setting, job string }{
		{"nats-url", "stream create"},
		{"dynamodb-endpoint", "table create"},
	} {
		u, err := url.Parse(first[dep.setting])
		if err != nil {
			t.Fatalf("%s %q: %v", dep.setting, first[dep.setting], err)
		}
		svc, ok := p.Services[u.Hostname()]
		if !ok || !slices.ContainsFunc(svc.Ports, func(p types.ServicePortConfig) bool { return strconv.Itoa(int(p.Target)) == u.Port() }) {
			t.Errorf("%s %s: no service %q with port %s", dep.setting, u, u.Hostname(), u.Port())
			continue
		}
		for _, j := range jobs {
			if !runs(j, dep.job) {
				continue
			}
			if d, ok := j.DependsOn[svc.Name]; !ok || d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s: depends on %s with %+v, want condition %s", j.Name, svc.Name, d, types.ServiceConditionHealthy)
			}
		}
	}

	// Conditions compose can meet: a health check to wait for, a job that
	// ends; and no host port published twice.
	published := map[string]string{}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		for dep, d := range s.DependsOn {
			target := p.Services[dep]
			switch d.Condition {
			case types.ServiceConditionHealthy:
				if hc := target.HealthCheck; hc == nil || hc.Disable || len(hc.Test) == 0 {
					t.Errorf("%s waits for %s to be healthy, which has no health check", name, dep)
				}
			case types.ServiceConditionCompletedSuccessfully:
				if target.Restart != "" && target.Restart != types.RestartPolicyNo {
					t.Errorf("%s waits for %s to complete, which restarts (%s)", name, dep, target.Restart)
				}
			}
		}
		for _, port := range s.Ports {
			key := port.HostIP + ":" + port.Published
			if other, ok := published[key]; ok {
				t.Errorf("%s and %s both publish %s", other, name, key)
			}
			published[key] = name
		}
	}

	t.Run("setup jobs", func(t *testing.T) {
		d := testenv.StartDynalite(t)
		ns := testenv.NATS(t)
		// The jobs, pointed at the local services instead of the project's.
		local := strings.NewReplacer(first["dynamodb-endpoint"], d.Endpoint, first["nats-url"], ns.ClientURL())
		for _, j := range jobs {
			args, env := slices.Clone(j.Command), environ(j)
			for i := range args {
				args[i] = local.Replace(args[i])
			}
			for i := range env {
				env[i] = local.Replace(env[i])
			}
			t.Logf("%s: %s", j.Name, strings.TrimSpace(hotcount(t, bin, args, env)))
		}

		ctx := context.Background()
		table := first["table"]
		if _, err := d.Client().DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table}); err != nil {
			t.Errorf("the sidecars' table %s does not exist after the jobs: %v", table, err)
		}
		js, err := jetstream.New(testenv.Connect(t, ns.ClientURL()))
		if err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, first["stream"])
		if err != nil {
			t.Fatalf("the sidecars' stream %s does not exist after the jobs: %v", first["stream"], err)
		}
		if subjects := st.CachedInfo().Config.Subjects; !slices.Contains(subjects, first["subject"]) {
			t.Errorf("stream %s takes %v, not the sidecars' subject %s", first["stream"], subjects, first["subject"])
		}
	})
}

// loadCompose loads the repository's compose.yaml as `docker compose` does:
// schema validation, interpolation (with an empty environment, so that the
// machine running the test cannot change the result), normalisation, paths
// resolved, and the consistency checks (unknown services, networks,
// volumes).
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{"../compose.yaml"}, cli.WithWorkingDirectory(".."))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return p
}

// checkEntrypoint asserts that the image runs /hotcount with a service's
// command as its arguments.
func checkEntrypoint(t *testing.T, dockerfile string) {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var entrypoint string
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "ENTRYPOINT "); ok {
			entrypoint = strings.TrimSpace(v)
		}
	}
	if entrypoint != `["/hotcount"]` {
		t.Errorf(`Dockerfile: ENTRYPOINT %s, want ["/hotcount"]: a service's command is hotcount's arguments`, entrypoint)
	}
}

// buildHotcount returns the hotcount command built as this test binary
// was (testenv.GoBuild), so that only its main package compiles: the
// image's static build (make build, the Dockerfile's flags) would compile
// every package again, about 2 minutes of make test from an empty build
// cache. What this test checks, that the binary takes each service's
// command and environment, does not depend on those flags; CI builds and
// runs the static binary itself after make test.
//
// It builds once per test binary (TestMain removes it): TestCompose and
// TestHelmSetupJobs run at once, and two go builds of one package at once
// both compile and link it, the build cache notwithstanding (27 s of CPU
// against 14 once, with the race detector, after cmd/hotcount changed).
func buildHotcount(t *testing.T) string {
	t.Helper()
	bin, err := hotcountBuild()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// hotcountDir is the folder of buildHotcount's build; TestMain removes it.
var hotcountDir string

var hotcountBuild = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "hotcount-deploy-test-")
	if err != nil {
		return "", err
	}
	hotcountDir = dir
	bin := filepath.Join(dir, "hotcount")
	args, env := testenv.GoBuild()
	cmd := exec.Command("go", append(append([]string{"build"}, args...), "-o", bin, "./cmd/hotcount")...)
	cmd.Dir = ".."
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/hotcount: %w\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if hotcountDir != "" {
		os.RemoveAll(hotcountDir) //nolint:errcheck // a temporary folder
	}
	os.Exit(code)
}

// hotcount runs the binary with args and exactly the environment env, as
// the container does (the image adds nothing), and returns its stdout.
func hotcount(t *testing.T, bin string, args, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hotcount %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// environ is a service's environment in os.Environ's form.
func environ(s types.ServiceConfig) []string {
	var env []string
	for k, v := range s.Environment {
		if v != nil {
			env = append(env, k+"="+*v)
		}
	}
	slices.Sort(env)
	return env
}

// runs reports whether service s runs the hotcount command cmd ("run",
// "table create"), whatever flags follow.
func runs(s types.ServiceConfig, cmd string) bool {
	words := strings.Fields(cmd)
	return len(s.Command) >= len(words) && slices.Equal(s.Command[:len(words)], words)
}
