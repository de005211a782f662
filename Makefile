# hotcount's one entry point for building, testing and measuring.
#   make test    every test, with the race detector, against real NATS and dynalite
#   make lint    go vet, gofmt, staticcheck, go.mod tidiness
#   make bench   the benchmarks (compare runs with benchstat)

GO          ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
DYNALITE    := test/dynalite/node_modules/.bin/dynalite
OPENAPI_TS  := test/openapi-client/node_modules/.bin/openapi-typescript
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: all build test lint bench soak demo deps image chart clean

all: lint test

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/hotcount ./cmd/hotcount

# dynalite (the DynamoDB API the tests run against), pinned by its lock file.
$(DYNALITE): test/dynalite/package.json test/dynalite/package-lock.json
	npm ci --prefix test/dynalite --no-audit --no-fund
	touch $@

# The TypeScript client's tools (openapi-typescript, openapi-fetch, tsc) for
# sidecar/openapi_ts_test.go, pinned by their lock file.
$(OPENAPI_TS): test/openapi-client/package.json test/openapi-client/package-lock.json
	npm ci --prefix test/openapi-client --no-audit --no-fund
	touch $@

deps: $(DYNALITE) $(OPENAPI_TS)
	$(GO) mod download

# Every test binary is built and linked once, as many at once as there
# are cores, into build/test (go test would link each again on every run);
# then test/run-tests runs them in two lanes at once, each a list of
# packages in turn, balanced by the times the tests take on a 2-core
# machine (docs/DEVELOPMENT.md has them). The lanes keep the heaviest
# suites apart: cmd/hotcount's (SIGKILLs, frozen processes, a NATS
# cluster, several sidecar processes under deadlines) runs beside the
# light packages, and sidecar's, cut in two halves, runs after each;
# deploy ends the first lane.
#
# deploy's binary is compiled in the background, at idle priority, while
# the tests run, and run last in its lane: its Helm, Kustomize and Compose
# dependencies are 541 packages no other test needs (of 1,299), 2 minutes
# of both cores from an empty build cache, that the tests' idle time can
# take.
# (Started with the other binaries' compile instead, it was no sooner
# ready: a second go command compiles again the packages the first is
# compiling.) It runs in a session of its own (setsid), so that a Ctrl-C
# or a failure stops it too: left running, it would put an old deploy.test
# into the next run's build/test.
#
# -vet=off: make lint runs go vet, every analyzer of it, where go test
# runs a few; from an empty build cache go test's vet of every dependency
# took 76 s of the compile's 10 CPU-minutes. GOGC=400 for the compiles
# only (the tests run as users' processes do): the compiler collects
# less often, about 10% less CPU (pipeline/store's test binary from an
# empty cache: 2 min 5 s and 2 min 12 s of user time, against 1 min 46 s
# and 2 min 0 s). The go builds inside tests (deploy's of the hotcount
# command, sidecar's of the generated client) use the test binary's own
# flags, testenv.GoBuild, and find their packages compiled.
#
# -trimpath keeps the folder out of the build cache's keys, so that another
# clone or worktree of the module reuses what this one compiled; -ldflags=-w
# leaves DWARF out of the test binaries, which takes about 30% off their
# links (a panic's trace still has files and lines; go test, run by hand,
# builds a binary a debugger can read).
TESTBIN := build/test
# sidecar's tests in the first lane (after cmd/hotcount): TestGlobalTable*,
# TestTrending*, TestHidden* and TestPartitionedFleet*, about 130 s alone;
# the rest of sidecar, about 170 s, runs in the second lane.
SIDECAR_FIRST := ^Test(GlobalTable|Trending|Hidden|PartitionedFleet)
# cmd/hotcount's mixed-fleet tests of the streams' rules run in the second
# lane, after the rest of sidecar: cmd/hotcount whole took 400-510 s, its
# lane some 140 s more than the other.
HOTCOUNT_SECOND := ^Test(MixedFleet|TheOddSidecar)
test: deps
	rm -rf $(TESTBIN) && mkdir -p $(TESTBIN)/late
	GOGC=400 $(GO) test -race -vet=off -trimpath -ldflags=-w -c -o $(TESTBIN)/ $$($(GO) list ./... | grep -v '/deploy$$')
	touch $(TESTBIN)/building; \
	setsid sh -c 'GOGC=400 chrt --idle 0 $(GO) test -race -vet=off -trimpath -ldflags=-w -c -o $(TESTBIN)/late/ ./deploy/ && mv $(TESTBIN)/late/deploy.test $(TESTBIN)/; \
	  rm -f $(TESTBIN)/building' & \
	late=$$!; trap 'kill -- -$$late 2>/dev/null; exit 130' INT TERM; \
	status=0; \
	test/run-tests $(TESTBIN) \
	  "./cmd/hotcount/!$(HOTCOUNT_SECOND) ./sidecar/@$(SIDECAR_FIRST) ./deploy/" \
	  "$$($(GO) list ./... | grep -v -e '/sidecar$$' -e '/cmd/hotcount$$' -e '/deploy$$') ./sidecar/!$(SIDECAR_FIRST) ./cmd/hotcount/@$(HOTCOUNT_SECOND)" \
	  || status=$$?; \
	[ $$status -eq 0 ] || kill -- -$$late 2>/dev/null; \
	wait; exit $$status

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) run $(STATICCHECK) ./...
	$(GO) mod tidy -diff

# Every benchmark, 3 runs each, into bench.out, then docs/BENCHMARKS.md.
# Benchmarks whose b.N is a workload size get a fixed -benchtime.
COUNT ?= 3
bench: deps
	$(GO) test -run '^$$' -bench 'BenchmarkAdd|BenchmarkLookupHTTP|BenchmarkWindowLookup|BenchmarkLookupCached|BenchmarkHandler|BenchmarkIngest' -benchmem -count $(COUNT) ./pipeline/aggregator/ ./pipeline/lookup/ ./pipeline/httpapi/ ./pipeline/ingest/ | tee bench.out
	$(GO) test -run '^$$' -bench 'BenchmarkWindowMemory|BenchmarkPersist' -benchtime 1x -count $(COUNT) ./pipeline/aggregator/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkContributorsMemory -benchtime 1x -count $(COUNT) ./pipeline/trend/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkJetStream -benchtime 200000x -count $(COUNT) ./sidecar/ | tee -a bench.out
	$(GO) test -run '^$$' -bench 'BenchmarkIngest|BenchmarkCounters|BenchmarkWindowWrites' -benchtime 1000000x -count $(COUNT) ./bench/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkClusterPartitions -benchtime 200000x -count $(COUNT) ./bench/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkFlush -benchtime 3000x -count $(COUNT) ./bench/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkSidecarRSS -benchtime 1000000x -count $(COUNT) ./cmd/hotcount/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkFleetReads -benchtime 2000x -count $(COUNT) ./fleet/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkFleetWrites -benchtime 4000x -count $(COUNT) ./sidecar/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkOutageRSS -benchtime 2000000x -count 1 ./cmd/hotcount/ | tee -a bench.out
	$(GO) test -run '^$$' -bench BenchmarkLongTail -benchtime 3000000x -count 1 ./cmd/hotcount/ | tee -a bench.out
	$(GO) run ./bench/report -in bench.out -out docs/BENCHMARKS.md

# A long run at a bounded rate: heap flat, counts exact. Not part of test.
SOAK ?= 60s
soak: deps
	$(GO) test -count=1 -run TestSoak -v ./sidecar/ -soak=$(SOAK)

# The hot-partition problem and its fix, live: hotcount demo starts dynalite
# on a free port, races against it and draws the chart in build/demo.svg
# (docs/demo.svg is the committed copy README shows: cp build/demo.svg docs/).
demo: deps
	AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo AWS_REGION=us-east-1 \
	$(GO) run ./cmd/hotcount demo --dynalite test/dynalite/serve.js --svg build/demo.svg

# The Helm chart as `helm template` renders it, through Helm's Go SDK (no
# helm binary), checked as deploy/helm_test.go checks every render, into
# chart.yaml: make chart VALUES=my-values.yaml
VALUES ?= deploy/helm/hotcount/ci/standalone-jetstream-values.yaml
chart:
	HOTCOUNT_CHART_VALUES=$(abspath $(VALUES)) HOTCOUNT_CHART_OUT=$(abspath chart.yaml) \
	  $(GO) test -count=1 -run '^TestHelmTemplate$$' ./deploy/ && cat chart.yaml

# The container image; needs a Docker engine (not on the development
# machines: deploy/deploy_test.go checks the Dockerfile instead).
IMAGE ?= hotcount
image:
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .

clean:
	rm -rf bin build bench.out chart.yaml
