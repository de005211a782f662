// Command report turns `go test -bench` output into docs/BENCHMARKS.md:
// the median of every metric per benchmark, and the ratio of each hotcount
// benchmark to its baseline from the same run (a sub-benchmark named
// "hotcount" next to "bare" or "jetstream-counters"). `make bench` runs it.
//
//	go run ./bench/report -in bench.out -out docs/BENCHMARKS.md
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	in := flag.String("in", "bench.out", "go test -bench output")
	out := flag.String("out", "docs/BENCHMARKS.md", "the report")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

// bench is one benchmark's results over its runs: metric unit -> values.
type bench struct {
	name    string
	pkg     string
	metrics map[string][]float64
	units   []string // in first-seen order
}

func (b *bench) median(unit string) (float64, bool) {
	v := slices.Clone(b.metrics[unit])
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], true
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2, true
}

func parse(r io.Reader) (benches []*bench, cpu string, err error) {
	byName := map[string]*bench{}
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = p
			continue
		}
		if c, ok := strings.CutPrefix(line, "cpu: "); ok {
			cpu = strings.TrimSpace(c)
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix
			}
		}
		b := byName[pkg+" "+name]
		if b == nil {
			b = &bench{name: name, pkg: pkg, metrics: map[string][]float64{}}
			byName[pkg+" "+name] = b
			benches = append(benches, b)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			unit := f[i+1]
			if _, seen := b.metrics[unit]; !seen {
				b.units = append(b.units, unit)
			}
			b.metrics[unit] = append(b.metrics[unit], v)
		}
	}
	return benches, cpu, sc.Err()
}

func run(in, out string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	benches, cpu, err := parse(f)
	if err != nil {
		return err
	}
	if len(benches) == 0 {
		return fmt.Errorf("no benchmark results in %s", in)
	}
	var w strings.Builder
	fmt.Fprintf(&w, "# Benchmarks\n\nWritten by `make bench` (`go run ./bench/report`) on %s, from `%s`.\n\n", time.Now().UTC().Format("2006-01-02"), in)
	fmt.Fprintf(&w, "Machine: %s, %d cores, %s/%s, %s. The machine is shared and noisy: read the ratios, each against a baseline measured in the same run, more than the absolute figures. Each figure is the median of the runs (`-count`).\n\n", cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())

	fmt.Fprintf(&w, "## Ratios against the baselines\n\nThroughput of hotcount's path over its baseline's, from ns/op (higher is better; 1.00× is as fast as the baseline), with the target where there is one.\n\n| package | benchmark | hotcount | baseline | hotcount ns/op | baseline ns/op | ratio | target |\n|---|---|---|---|---|---|---|---|\n")
	for _, b := range benches {
		parent, leaf, ok := cut(b.name)
		// The bare consumers are rows too: against the counters they bound
		// what any consumer of the stream can reach.
		consumer := strings.HasPrefix(leaf, "bare-consumer")
		if !ok || (leaf != "hotcount" && leaf != "hotcount-jetstream" && leaf != "hotcount-jetstream-100ms" && leaf != "hotcount-partitioned" && leaf != "hotcount-cold" && leaf != "windows-1m+1h" && leaf != "8-streams" && leaf != "hotcount-by" && !consumer) {
			continue
		}
		// 8-streams against 1-stream: BenchmarkClusterPartitions' only pair.
		// hotcount-by against hotcount: the cost of a mention's "by".
		for _, base := range []string{"hotcount", "bare", "bare-conditional", "bare-consumer-noack", "bare-consumer-filtered", "jetstream-counters", "windows-none", "1-stream"} {
			bb := find(benches, b.pkg, parent+"/"+base)
			// Each durable mode against the bare consumer that sends no
			// acknowledgements, as it sends none (unfiltered: partitioned
			// mode's partition streams need no filter), and the counters.
			if bb == nil || bb == b || (base == "hotcount" && leaf != "hotcount-by") || (base == "bare-consumer-noack" && !strings.HasPrefix(leaf, "hotcount-")) ||
				base == "bare-consumer-filtered" || (consumer && base != "jetstream-counters") {
				continue
			}
			h, _ := b.median("ns/op")
			x, _ := bb.median("ns/op")
			target := "none"
			if t, ok := targets[strings.SplitN(parent, "/", 2)[0]+" "+leaf+" "+base]; ok {
				verdict := "met"
				if x/h < t {
					verdict = "**missed**"
				}
				target = fmt.Sprintf("≥ %.1f×: %s", t, verdict)
			}
			fmt.Fprintf(&w, "| `%s` | `%s` | %s | %s | %s | %s | **%.2f×** | %s |\n",
				strings.TrimPrefix(b.pkg, "github.com/hotcount/hotcount/"), parent, leaf, base, num(h), num(x), x/h, target)
		}
	}

	fmt.Fprintf(&w, "\n## Every result\n\n| package | benchmark | metrics (median) |\n|---|---|---|\n")
	for _, b := range benches {
		var ms []string
		for _, u := range b.units {
			v, _ := b.median(u)
			ms = append(ms, num(v)+" "+u)
		}
		fmt.Fprintf(&w, "| `%s` | `%s` | %s |\n", strings.TrimPrefix(b.pkg, "github.com/hotcount/hotcount/"), b.name, strings.Join(ms, ", "))
	}
	fmt.Fprintf(&w, "\n## How to reproduce\n\n`make bench` runs the commands below into `bench.out` and writes this file; compare two runs' `bench.out` with benchstat.\n\n```\n%s```\n", commands)
	if err := os.MkdirAll(dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(w.String()+notes), 0o644)
}

// targets are the issues' targets for the ratios, by top benchmark name,
// hotcount's variant and the baseline.
var targets = map[string]float64{
	"BenchmarkIngest hotcount bare":                              0.9,
	"BenchmarkFlush hotcount bare-conditional":                   0.9,
	"BenchmarkFlush hotcount-cold bare-conditional":              0.8,
	"BenchmarkLookupHTTP hotcount bare":                          0.9,
	"BenchmarkJetStream hotcount bare":                           0.9,
	"BenchmarkCounters hotcount-jetstream jetstream-counters":    1.0,
	"BenchmarkCounters hotcount-partitioned jetstream-counters":  1.0,
	"BenchmarkCounters hotcount-jetstream bare-consumer-noack":   0.9,
	"BenchmarkCounters hotcount-partitioned bare-consumer-noack": 0.9,
}

// commands mirrors the bench target of the Makefile, for the reader.
const commands = `go test -run '^$' -bench 'BenchmarkAdd|BenchmarkLookupHTTP|BenchmarkWindowLookup|BenchmarkLookupCached|BenchmarkHandler|BenchmarkIngest' -benchmem -count 3 ./pipeline/aggregator/ ./pipeline/lookup/ ./pipeline/httpapi/ ./pipeline/ingest/
go test -run '^$' -bench 'BenchmarkWindowMemory|BenchmarkPersist' -benchtime 1x -count 3 ./pipeline/aggregator/
go test -run '^$' -bench BenchmarkContributorsMemory -benchtime 1x -count 3 ./pipeline/trend/
go test -run '^$' -bench BenchmarkJetStream -benchtime 200000x -count 3 ./sidecar/
go test -run '^$' -bench 'BenchmarkIngest|BenchmarkCounters|BenchmarkWindowWrites' -benchtime 1000000x -count 3 ./bench/
go test -run '^$' -bench BenchmarkClusterPartitions -benchtime 200000x -count 3 ./bench/
go test -run '^$' -bench BenchmarkFlush -benchtime 3000x -count 3 ./bench/
go test -run '^$' -bench BenchmarkSidecarRSS -benchtime 1000000x -count 3 ./cmd/hotcount/
go test -run '^$' -bench BenchmarkFleetReads -benchtime 2000x -count 3 ./fleet/
go test -run '^$' -bench BenchmarkFleetWrites -benchtime 4000x -count 3 ./sidecar/
go test -run '^$' -bench BenchmarkOutageRSS -benchtime 2000000x -count 1 ./cmd/hotcount/
go test -run '^$' -bench BenchmarkLongTail -benchtime 3000000x -count 1 ./cmd/hotcount/
`

const notes = `
## What each compares

- ` + "`bench.BenchmarkIngest`" + `: a full-speed publisher into a NATS server in a separate process, 1,000 topics (uniform, Zipf s=1.1), empty payloads and {"count":1} (the JSON producers send); bare = a nats.go queue subscriber that only counts; hotcount = its subscriber parsing, validating and adding to the aggregator. ` + "`drops`" + ` are slow-consumer drops (must be 0); ` + "`cpu-s/M`" + ` is CPU seconds of the whole test process (publisher included) per million mentions.
- ` + "`ingest.BenchmarkIngest`" + `: the same on an in-process server, the payload ` + "`{\"count\":1}`" + `; hotcount-by publishes ` + "`{\"count\":1,\"by\":\"<id>\"}`" + ` with a million distinct ids and sketches each contributor for trending (trend.Contributors, as the sidecar does with time buckets on): its ratio to hotcount is what a mention's ` + "`by`" + ` costs.
- ` + "`trend.BenchmarkContributorsMemory`" + `: the trending sketch's memory for contributors at its bound: a million distinct contributors a minute over 1,000 topics for 20 minutes, through the collector, the summaries and the fleet's merge; ` + "`MiB`" + ` is the heap it holds after, ` + "`bound-MiB`" + ` the stated bound (512 sketches a minute of at most 4.2 KiB, for the minutes that keep sketches).
- ` + "`bench.BenchmarkFlush`" + `: UpdateItem calls per second against dynalite with 16 in flight: the flusher (idempotent conditional writes) against the bare SDK client sending a plain ADD, and bare-conditional, the bare client sending hotcount's conditional write (dynalite evaluates conditions slowly: that row is the fair baseline). ` + "`wcu/topic`" + ` is write units per flushed topic, ` + "`item-bytes-*`" + ` the shard items' billed size; hotcount-8-writers has 8 writers take turns on the same 400 items; hotcount-cold is a cold start, the defaults' flusher (one shard for new topics, adaptive counts, metadata looked up in batches) against a table holding every topic already with no metadata item, each topic busy (two mentions), target 0.8× bare-conditional.
- ` + "`bench.BenchmarkCounters`" + `: NATS JetStream counters (ADR-49, one publish with Nats-Incr per mention, acknowledged by the stream) against hotcount on the same server with the same publisher: hotcount-jetstream is like for like (asynchronous JetStream publishes with acks, hotcount in JetStream mode, counted = written exactly once by stream position, the stream read without acknowledgements); hotcount-partitioned the same in partitioned mode (16 partition streams routed by the server's mapping, all owned by the one sidecar); both at the defaults (1 s flush interval), and hotcount-jetstream-100ms with --flush-interval 100ms; hotcount is the core-mode path (core publishes, at most once across a crash). The bare consumers bound what any consumer of the stream can reach: bare-consumer is a durable consumer on the same stream and publisher acknowledging each message on arrival and keeping nothing, bare-consumer-ackall acknowledges one message in 500 under AckAll, bare-consumer-noack none (AckNone), and bare-consumer-filtered is bare-consumer with a filter (` + "`mentions.*`" + `) that matches every message but is not the stream's subject, as each of the previous release's partitioned consumers was (kept to show why partitioned mode moved to partition streams). The NATS server is a separate process and the bound: the counters only store each mention, a consumer needs it stored and delivered, and (under AckExplicit) acknowledged with one ack message each; the durable modes send none, so the bare consumer that sends none (bare-consumer-noack) is their baseline (target: 0.9×), and the counters theirs too (target: 1.0×); a filtered consumer behind its publisher is delivered to at about half the unfiltered rate. b.N mentions over 1,000 Zipf topics, embedded store; ` + "`writes/mention`" + ` is hotcount's store writes per mention: its inverse is the write reduction. ` + "`server-cpu-s/M`" + ` is the NATS server process's CPU seconds (user and system, from /proc) per million mentions over the timed part, ` + "`process-cpu-s/M`" + ` the test process's: in jetstream-counters that is the publisher alone, so hotcount-jetstream's and hotcount-partitioned's less the counters' is hotcount's own CPU per million mentions (same acknowledged publisher); the core-mode row's publisher sends core publishes, cheaper, so its difference understates hotcount's cost by what acknowledged publishing costs more; against bare-consumer it is what hotcount costs beyond a consumer that keeps nothing. ` + "`bench.BenchmarkWindowWrites`" + ` reports both too.
- ` + "`bench.BenchmarkClusterPartitions`" + `: partitioned mode on a 3-node NATS cluster (three server processes on 127.0.0.1, each with its own store), the partition streams at R3 with their leaders spread (` + "`streams.Spread`" + `; ` + "`max-leaders-per-server`" + `), one sidecar owning every partition, the counters' acknowledged publisher, b.N mentions over 1,000 Zipf topics: 8 partition streams against 1. ` + "`server-cpu-s/M`" + ` is the three servers' CPU summed, ` + "`process-cpu-s/M`" + ` the publisher's and sidecar's, ` + "`cores-busy`" + ` all of it over the elapsed time. On this machine the three servers, the sidecar and the publisher share its cores, so it shows no scaling, no network (loopback routes) and no fleet: it shows what R3 costs in CPU per mention (against hotcount-partitioned's one server at R1) and whether 8 streams beat 1 when the cores are shared (the ratio above).
- ` + "`sidecar.BenchmarkJetStream`" + `: hotcount in JetStream mode (the durable engine: writes by stream position; done when every mention is written) against a bare consumer acking on arrival.
- ` + "`httpapi.BenchmarkLookupHTTP`" + `: 16 keep-alive clients GET one hot topic over loopback: hotcount's cached lookup against a trivial handler writing the same JSON; p50/p99 latency, and the shard reads of the storm against the bound (duration / TTL + 1) × N.
- ` + "`httpapi.BenchmarkWindowLookup`" + `: the same storm on a windowed count, ` + "`?window=1h`" + ` (60 minute buckets, one shard), cached for 1 s, against a trivial handler writing the same JSON; ` + "`store-reads`" + ` are the windowed reads that went to the store, against the bound duration / TTL + 1, and ` + "`batches`" + ` the BatchGetItem-sized batches they took.
- ` + "`bench.BenchmarkWindowWrites`" + `: what time buckets cost to write: ` + "`BenchmarkCounters/hotcount`" + `'s load (core publishes of b.N mentions over 1,000 Zipf topics, embedded store, 100 ms flushes) with ` + "`--windows 1m,1h`" + ` (dev's default) against ` + "`--windows none`" + ` (run's); ` + "`writes/mention`" + ` is store writes per mention: about 2×, not 3×, because flushes of three writes a topic take longer and fewer run in the same time (each writes 3 per topic: ` + "`TestConservation`" + `, one write per item).
- ` + "`aggregator.BenchmarkPersist`" + `: the shutdown's spill write in core mode: a window of 1,000,000 topics (27-byte names, about 56 MiB as the buffer budget counts it) written to the spill folder and synced, in MB/s of budget bytes. The final flush leaves this write a quarter of the slowest of three runs here (276–418 MB/s on 2026-12-03): 64 MiB/s ( ` + "`flusher.persistRate`" + `) before the shutdown's reserve.
- ` + "`aggregator.BenchmarkWindowMemory`" + `: heap per buffered topic: its slot in the window's table (aggregator.Deltas) and its name, copied into the window's shared chunks (the caller's string is not kept).
- ` + "`fleet.BenchmarkFleetReads`" + `: a read storm on 10 hot topics from 4 sidecars (lookup services) on one NATS server and one embedded store, 100 ms TTL: gathers per topic per TTL for the whole fleet, each sidecar gathering alone against ` + "`--share-totals`" + ` (target: 1.5 or fewer shared).
- ` + "`sidecar.BenchmarkFleetWrites`" + `: 4 sidecars on one NATS server and one dynalite table take mentions over 1,000 Zipf topics at 400 a second (the store keeps up in every mode), 500 ms flush interval, 16 partitions: UpdateItem calls counted at the table while they stream in. queue = core NATS queue group, jetstream = one durable consumer shared by the fleet, partitioned = ` + "`--nats-mode partitioned`" + `. ` + "`hot-writes/interval`" + ` is the hottest topic's writes per flush interval for the whole fleet (target: at most 1.2 partitioned, against about 4 shared); ` + "`writes/s`" + ` all topics'.
- ` + "`cmd/hotcount.BenchmarkOutageRSS`" + `: a real ` + "`hotcount run`" + ` process in core mode whose DynamoDB endpoint does not answer takes b.N mentions of b.N distinct topics (2,000,000). spill: the manifests' 256 MiB limit and the default ` + "`--buffer-memory`" + ` (an eighth of it): the window spills to disk and the peak RSS must stay under the limit. memory: no limit, no spill, every topic in memory; ` + "`B/topic`" + ` is (peak − idle RSS) per topic beyond the topic's own bytes, GC headroom included (target: 100 B at 1,000,000 topics; ` + "`go test -run '^$' -bench 'BenchmarkOutageRSS/memory' -benchtime 1000000x ./cmd/hotcount/`" + ` gave 90.7, 92.8 and 90.9 B in three runs on 2026-12-03, where this run's 2,000,000 spread the fixed costs thinner). Both must take every mention.
- ` + "`cmd/hotcount.BenchmarkLongTail`" + `: the issue's long tail: a real ` + "`hotcount run --store bolt`" + ` process (core mode, default settings) takes b.N mentions of b.N distinct topics (3,000,000) at a steady 20,000 new topics a second for 150 s. ` + "`written-topics/s`" + ` is the rate of mentions written (each a topic of its own) from a third of the way in to the end of the load and ` + "`keep-up`" + ` that over the rate published in the same span (target: 1.00); ` + "`buffered-at-end`" + ` the topics in the buffer when the load stops (target: about two 1 s intervals, 40,000), ` + "`unwritten-at-end`" + ` those and every other topic published and not yet written (in the flush under way, on their way from NATS), and ` + "`drain-s`" + ` the time until every mention is written; the anonymous RSS (the heap: the buffer, and bbolt's free list and dirty pages) a third of the way in and the most it reached after (target: flat), and the file-backed RSS at the end: bbolt's mapped file, which grows with the topics stored and which the kernel may drop. Every mention must be written, none dropped.

## Write reduction

` + "`bench.BenchmarkCounters/hotcount`" + ` reports store writes per mention for 1,000,000 mentions over 1,000 topics at about 1 M mentions/s with a 100 ms flush interval: about 0.008 (the table above), over 100 times fewer UpdateItem calls than one per mention. A flush writes at most one UpdateItem per distinct topic in its window, so at the default 1 s interval the same load is at most 1,000 writes a second: 1,000 times fewer (the flusher tests pin "one write per topic per flush": ` + "`TestConservation`" + `).

## Memory of the process

` + "`cmd/hotcount.BenchmarkSidecarRSS`" + ` runs a real ` + "`hotcount run`" + ` process (core mode, embedded store) and reads its RSS from /proc: at idle, and the peak while it takes 1,000,000 mentions over 1,000 topics from a full-speed publisher and flushes them. The Kubernetes manifests' memory request (64 Mi) and limit (256 Mi) are sized from it and from the per-topic figure (deploy/kubernetes/base/deployment.yaml).
`

func cut(name string) (parent, leaf string, ok bool) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}

func find(bs []*bench, pkg, name string) *bench {
	for _, b := range bs {
		if b.pkg == pkg && b.name == name {
			return b
		}
	}
	return nil
}

func dir(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return "."
}

func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
