package bench_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/shardcount"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
)

// serverEnv makes the test binary run a NATS server instead of tests, so
// that the ingest benchmark's server is a separate process.
// partitionsEnv, when set, gives it partitioned mode's mapping into that
// many partition streams (benchLayout). clusterPortEnv, when set, makes it
// a node of a cluster (clusterNode: nameEnv, routesEnv).
const serverEnv, storeEnv, partitionsEnv = "HC_BENCH_NATS_PORT", "HC_BENCH_NATS_STORE", "HC_BENCH_NATS_PARTITIONS"

// benchLayout is partitioned mode's layout with n partitions, as the
// benchmarks' sidecars are configured.
func benchLayout(n int) streams.Layout {
	return streams.Layout{Stream: ingest.DefaultStream, Subject: "mentions.>", Partitions: n}
}

func TestMain(m *testing.M) {
	if port := os.Getenv(serverEnv); port != "" {
		p, _ := strconv.Atoi(port)
		var mappings map[string]string
		if n, _ := strconv.Atoi(os.Getenv(partitionsEnv)); n > 0 {
			mappings = testenv.Partitioned(benchLayout(n))
		}
		start := embeddednats.Start
		if os.Getenv(clusterPortEnv) != "" {
			start = clusterNode
		}
		s, err := start(p, os.Getenv(storeEnv), mappings)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		s.WaitForShutdown() // until killed
		return
	}
	os.Exit(m.Run())
}

func freePort(tb testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// natsServer is a NATS server running in a child process (natsProcess).
type natsServer struct {
	URL string
	pid int
}

// natsProcess starts a NATS server in a child process.
func natsProcess(b *testing.B) natsServer { return natsProcessMapped(b, 0) }

// natsProcessMapped is natsProcess with partitioned mode's mapping into
// partitions partition streams (none for 0).
func natsProcessMapped(b *testing.B, partitions int) natsServer {
	return startNATS(b, partitionsEnv+"="+strconv.Itoa(partitions))
}

// startNATS runs this test binary as a NATS server (TestMain's server
// mode) on a free port, storing in a folder of its own, with env added to
// its environment, and waits until it takes connections. It is killed when
// b ends.
func startNATS(b *testing.B, env ...string) natsServer {
	port := freePort(b)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), serverEnv+"="+strconv.Itoa(port), storeEnv+"="+b.TempDir())
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr // why it failed to start, if it does
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // killed
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	testenv.Eventually(b, 20*time.Second, func() error {
		nc, err := nats.Connect(url)
		if err == nil {
			nc.Close()
		}
		return err
	})
	return natsServer{URL: url, pid: cmd.Process.Pid}
}

// clockTick is the unit of the CPU times in /proc/<pid>/stat: USER_HZ,
// sysconf(_SC_CLK_TCK), 100 on every architecture Linux and Go share.
const clockTick = 10 * time.Millisecond

// cpu is the server process's CPU time so far, user and system, of all
// its threads: utime and stime in /proc/<pid>/stat.
func (s natsServer) cpu() (time.Duration, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(s.pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces and parentheses: the state is the first of them, utime
	// the 12th and stime the 13th (proc(5) numbers them 3, 14 and 15).
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", s.pid, stat)
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime: %w", s.pid, err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: stime: %w", s.pid, err)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// subjects is a sequence of n subjects over 1,000 topics, uniform or Zipf.
func subjects(n int, zipf bool) []string {
	topics := make([]string, 1000)
	for i := range topics {
		topics[i] = "mentions.topic-" + strconv.Itoa(i)
	}
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.1, 1, 999)
	out := make([]string, n)
	for i := range out {
		if zipf {
			out[i] = topics[z.Uint64()]
		} else {
			out[i] = topics[r.IntN(1000)]
		}
	}
	return out
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru) //nolint:errcheck // always succeeds for SELF
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter measures the CPU a benchmark's timed part takes: its NATS
// servers' (child processes, summed) and this process's (the publisher,
// and the sidecar or the consumer where there is one). The servers' is
// counted in clock ticks of 10 ms: over 1,000,000 mentions that is 0.01
// CPU seconds per million, over 100,000 0.1.
type cpuMeter struct {
	servers           []natsServer
	server0, process0 time.Duration
	// server and process are the CPU taken from start to stop.
	server, process time.Duration
	noServer        error // the servers' CPU cannot be read (not Linux)
}

func newCPUMeter(servers ...natsServer) *cpuMeter { return &cpuMeter{servers: servers} }

// serverCPU is the servers' CPU time so far, summed.
func (m *cpuMeter) serverCPU() time.Duration {
	var sum time.Duration
	for _, s := range m.servers {
		d, err := s.cpu()
		if err != nil {
			m.noServer = err
		}
		sum += d
	}
	return sum
}

// start resets b's timer, where the timed part starts, and reads the
// clocks.
func (m *cpuMeter) start(b *testing.B) {
	b.ResetTimer()
	m.server0, m.process0 = m.serverCPU(), cpuTime()
}

// stop stops b's timer, where the timed part ends, and reports the CPU
// seconds taken since start per million mentions (b.N): the servers'
// ("server-cpu-s/M") and this process's ("process-cpu-s/M").
func (m *cpuMeter) stop(b *testing.B) {
	b.StopTimer()
	m.server, m.process = m.serverCPU()-m.server0, cpuTime()-m.process0
	perM := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(b.N) }
	if m.noServer == nil {
		b.ReportMetric(perM(m.server), "server-cpu-s/M")
	} else {
		b.Logf("no server-cpu-s/M: %v", m.noServer)
	}
	b.ReportMetric(perM(m.process), "process-cpu-s/M")
}

// BenchmarkIngest is the ingest comparison: a full-speed publisher into a
// NATS server in a separate process, 1,000 topics, uniform and Zipf, empty
// payloads and `{"count":1}` (what producers send);
// "bare" is a nats.go queue subscriber that only counts, "hotcount" is
// hotcount's subscriber adding into the aggregator. It reports msgs/s, the
// slow-consumer drops (must be 0) and CPU (whole test process, publisher
// included) per million mentions.
func BenchmarkIngest(b *testing.B) {
	payloads := []struct {
		name string
		body []byte
	}{{"empty", nil}, {"json", []byte(`{"count":1}`)}}
	for _, dist := range []string{"uniform", "zipf"} {
		for _, pl := range payloads {
			for _, who := range []string{"bare", "hotcount"} {
				ingestRun(b, dist, pl.name, pl.body, who)
			}
		}
	}
}

// ingestRun is one BenchmarkIngest case: b.N mentions over 1,000 topics
// (dist), each with payload body, published at full speed into a NATS
// server process and taken by who: a bare counting subscriber or hotcount's.
func ingestRun(b *testing.B, dist, payload string, body []byte, who string) {
	b.Run(dist+"/"+payload+"/"+who, func(b *testing.B) {
		url := natsProcess(b).URL
		subs := subjects(b.N, dist == "zipf")
		var got atomic.Int64
		reg := prometheus.NewRegistry()
		m := ingest.NewMetrics(reg)
		nc, err := ingest.Connect(url, zap.NewNop(), m)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		var dropped func() int
		if who == "bare" {
			s, err := nc.QueueSubscribe("mentions.>", "hotcount", func(*nats.Msg) { got.Add(1) })
			if err != nil {
				b.Fatal(err)
			}
			s.SetPendingLimits(512<<10, 64<<20) //nolint:errcheck // valid
			dropped = func() int { n, _ := s.Dropped(); return n }
		} else {
			agg := aggregator.New(aggregator.DefaultMaxTopics, reg)
			sub, err := ingest.NewSubscriber(nc, ingest.Config{Subject: "mentions.>", QueueGroup: "hotcount", DrainTimeout: time.Second,
				Limits: mention.Limits{MaxCount: mention.DefaultMaxCount, MaxTopicBytes: mention.DefaultMaxTopicBytes}},
				counting{agg, &got}, zap.NewNop(), m)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			defer func() { cancel(); <-done }()
			testenv.Eventually(b, 5*time.Second, sub.Ready)
			dropped = func() int { return int(testenv.Metric(b, reg, "hotcount_ingest_dropped_total")) }
		}
		nc.Flush() //nolint:errcheck // the publisher flushes too
		pub, err := nats.Connect(url)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		cpu0 := cpuTime()
		b.ReportAllocs()
		b.ResetTimer()
		for _, s := range subs {
			pub.Publish(s, body) //nolint:errcheck // flushed below
		}
		pub.Flush() //nolint:errcheck // checked by the count
		deadline := time.Now().Add(2 * time.Minute)
		for got.Load() < int64(b.N) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
		b.StopTimer()
		if got.Load() != int64(b.N) {
			b.Fatalf("received %d of %d (dropped %d)", got.Load(), b.N, dropped())
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		b.ReportMetric(float64(dropped()), "drops")
		b.ReportMetric((cpuTime()-cpu0).Seconds()*1e6/float64(b.N), "cpu-s/M")
	})
}

type counting struct {
	agg *aggregator.Aggregator
	got *atomic.Int64
}

func (c counting) Add(topic string, delta int64) { c.agg.Add(topic, delta); c.got.Add(1) }

// BenchmarkFlush is the flush throughput: b.N topics written once each to
// dynalite, 16 writes in flight. "bare" issues the same UpdateItem calls
// with the bare SDK client and an errgroup; "hotcount" fills the aggregator
// and runs one Flush. Same dynalite, same client settings, same run.
func BenchmarkFlush(b *testing.B) {
	d := testenv.StartDynalite(b)
	testenv.AWSEnv(b)
	table := d.Table(b, "flush")
	client, err := store.NewDynamoDBClient(context.Background(), d.Endpoint)
	if err != nil {
		b.Fatal(err)
	}
	const concurrency = 16
	var run atomic.Int64
	b.Run("bare", func(b *testing.B) {
		prefix := fmt.Sprintf("bare%d-", run.Add(1))
		g := new(errgroup.Group)
		g.SetLimit(concurrency)
		b.ResetTimer()
		for i := range b.N {
			g.Go(func() error {
				_, err := client.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
					TableName:                 &table,
					Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: schema.ShardKey(prefix+strconv.Itoa(i), i%4)}},
					UpdateExpression:          aws.String("ADD #count :delta SET #updatedAt = :now"),
					ExpressionAttributeNames:  map[string]string{"#count": "count", "#updatedAt": "updatedAt"},
					ExpressionAttributeValues: map[string]types.AttributeValue{":delta": &types.AttributeValueMemberN{Value: "1"}, ":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().UnixMilli(), 10)}},
				})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
	})
	// The same idempotent write hotcount sends (condition on the writer's
	// mark, the item returned), from the bare client: what the store's
	// API costs, apart from hotcount's code.
	b.Run("bare-conditional", func(b *testing.B) {
		prefix := fmt.Sprintf("barec%d-", run.Add(1))
		g := new(errgroup.Group)
		g.SetLimit(concurrency)
		b.ResetTimer()
		for i := range b.N {
			g.Go(func() error {
				_, err := client.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
					TableName:                 &table,
					Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: schema.ShardKey(prefix+strconv.Itoa(i), i%4)}},
					UpdateExpression:          aws.String("ADD #count :delta SET #updatedAt = :now, #mark = :seq"),
					ConditionExpression:       aws.String("(attribute_not_exists(#mark) AND (attribute_not_exists(#floor) OR #floor < :seq)) OR #mark < :seq"),
					ExpressionAttributeNames:  map[string]string{"#count": "count", "#updatedAt": "updatedAt", "#mark": "w_bench", "#floor": store.AttrFloor},
					ExpressionAttributeValues: map[string]types.AttributeValue{":delta": &types.AttributeValueMemberN{Value: "1"}, ":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().UnixMilli(), 10)}, ":seq": &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().UnixMicro(), 10)}},
					ReturnValues:              types.ReturnValueAllNew,
				})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
	})
	b.Run("hotcount", func(b *testing.B) {
		prefix := fmt.Sprintf("hot%d-", run.Add(1))
		reg := prometheus.NewRegistry()
		agg := aggregator.New(b.N+1, reg)
		st := store.NewDynamoDB(client, table, store.NewMetrics(reg))
		fl := flusher.New(flusher.Config{Shards: 4, Interval: time.Hour, Timeout: time.Hour, Concurrency: concurrency},
			agg, st, zap.NewNop(), flusher.NewMetrics(reg), time.Now)
		for i := range b.N {
			agg.Add(prefix+strconv.Itoa(i), 1)
		}
		b.ResetTimer()
		if err := fl.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		b.StopTimer()
		reportUnits(b, d, table, prefix, reg, b.N)
	})
	// A cold start: a sidecar with the defaults (one shard for new
	// topics, adaptive shard counts) starts against a table holding b.N
	// topics that no metadata item records, and each comes in busy (two
	// mentions): the flush looks up their shard counts in batches, then
	// writes them, at the store's pace (target: at least 0.8× the bare
	// client's conditional writes).
	b.Run("hotcount-cold", func(b *testing.B) {
		prefix := fmt.Sprintf("cold%d-", run.Add(1))
		ctx := context.Background()
		var batch []types.WriteRequest
		put := func() {
			if _, err := client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{table: batch}}); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
		for i := range b.N { // written before: counts, no metadata
			batch = append(batch, types.WriteRequest{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: schema.ShardKey(prefix+strconv.Itoa(i), 0)}, "count": &types.AttributeValueMemberN{Value: "5"},
			}}})
			if len(batch) == 25 {
				put()
			}
		}
		if len(batch) > 0 {
			put()
		}
		reg := prometheus.NewRegistry()
		agg := aggregator.New(b.N+1, reg)
		st := store.NewDynamoDB(client, table, store.NewMetrics(reg))
		book := shardcount.New(shardcount.Config{Default: 1, Adaptive: true, Max: shardcount.DefaultMax, Every: shardcount.DefaultEvery}, st, zap.NewNop(), reg, time.Now)
		fl := flusher.New(flusher.Config{Shards: 1, Interval: time.Hour, Timeout: time.Hour, Concurrency: concurrency},
			agg, st, zap.NewNop(), flusher.NewMetrics(reg), time.Now, flusher.WithShards(book))
		for i := range b.N {
			agg.Add(prefix+strconv.Itoa(i), 2)
		}
		b.ResetTimer()
		if err := fl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		b.StopTimer()
		for i := 0; i < b.N; i += max(1, b.N/100) { // written whole: 5 + 2
			shards, err := st.Gather(ctx, prefix+strconv.Itoa(i), 1, true)
			if err != nil {
				b.Fatal(err)
			}
			if sum, _ := schema.Sum(shards); sum != 7 {
				b.Fatalf("topic %d reads %d, want 7", i, sum)
			}
		}
	})
	// A fleet: 8 writers take turns flushing the same 100 topics (400
	// items), so that every item carries several writers' marks.
	b.Run("hotcount-8-writers", func(b *testing.B) {
		prefix := fmt.Sprintf("fleet%d-", run.Add(1))
		reg := prometheus.NewRegistry()
		st := store.NewDynamoDB(client, table, store.NewMetrics(reg))
		const writers, topics = 8, 100
		var fls []*flusher.Flusher
		var aggs []*aggregator.Aggregator
		for range writers {
			agg := aggregator.New(topics+1, prometheus.NewRegistry())
			aggs = append(aggs, agg)
			fls = append(fls, flusher.New(flusher.Config{Shards: 4, Interval: time.Hour, Timeout: time.Hour, Concurrency: concurrency},
				agg, st, zap.NewNop(), flusher.NewMetrics(prometheus.NewRegistry()), time.Now))
		}
		b.ResetTimer()
		flushed := 0
		for round := 0; flushed < b.N; round++ {
			w := round % writers
			for i := 0; i < topics && flushed < b.N; i++ {
				aggs[w].Add(prefix+strconv.Itoa(i), 1)
				flushed++
			}
			if err := fls[w].Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		b.StopTimer()
		reportUnits(b, d, table, prefix, reg, b.N)
	})
}

// reportUnits reports the write units a flushed topic cost: every item
// under prefix is read back and sized as DynamoDB bills it; each write
// costs a unit per started KB, and trims of old writer marks cost one more
// each.
func reportUnits(b *testing.B, d *testenv.Dynalite, table, prefix string, reg *prometheus.Registry, topics int) {
	maxSize, total, items := 0, 0, 0
	p := dynamodb.NewScanPaginator(d.Client(), &dynamodb.ScanInput{TableName: &table})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		for _, it := range page.Items {
			if pk, _ := it["pk"].(*types.AttributeValueMemberS); pk == nil || !strings.HasPrefix(pk.Value, schema.KeyPrefix+prefix) {
				continue
			}
			size := store.ItemSize(it)
			maxSize, total, items = max(maxSize, size), total+size, items+1
		}
	}
	writes := testenv.Metric(b, reg, "hotcount_store_writes_total")
	trims := testenv.Metric(b, reg, "hotcount_store_trims_total")
	unitsPerWrite := float64((maxSize + 1023) / 1024)
	b.ReportMetric(float64(maxSize), "item-bytes-max")
	b.ReportMetric(float64(total)/float64(max(items, 1)), "item-bytes-mean")
	b.ReportMetric((writes*unitsPerWrite+trims)/float64(topics), "wcu/topic")
}

// BenchmarkCounters compares the alternative a user would pick, NATS's own
// JetStream counters (ADR-49: a stream with allow_msg_counter, one publish
// with a Nats-Incr header per mention, acknowledged by the stream), with
// hotcount in each mode on the embedded store: core (core publishes, until
// every mention is written), jetstream and partitioned (acknowledged
// asynchronous JetStream publishes, until every mention is written and its
// message acknowledged). The bare consumers bound what any consumer of the
// stream can reach. Each counts b.N mentions over 1,000 Zipf topics on a
// NATS server of its own, a separate process; the figure is mentions/s.
//
// Each also reports CPU seconds per million mentions over the timed part:
// the NATS server process's (server-cpu-s/M) and this process's
// (process-cpu-s/M). In jetstream-counters this process is only the
// publisher, so a hotcount run's process-cpu-s/M less the counters' is
// hotcount's own cost: the publisher is the same in hotcount-jetstream
// and hotcount-partitioned (acknowledged asynchronous publishes, the
// counters' carrying a header more), where hotcount's core-mode run
// publishes core messages, cheaper to send, so its difference is hotcount's
// cost less what the acknowledged publisher costs beyond core publishes.
// Against the bare consumers (publisher and a consumer that keeps nothing)
// the difference is what hotcount costs beyond consuming the stream.
// server-cpu-s/M is the server's own work per mention in each mode: storing
// only (the counters), or also delivering and taking acks.
func BenchmarkCounters(b *testing.B) {
	b.Run("jetstream-counters", func(b *testing.B) {
		srv := natsProcess(b)
		nc := testenv.Connect(b, srv.URL)
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
			Name: "COUNTERS", Subjects: []string{"counters.>"}, AllowMsgCounter: true, AllowDirect: true, Storage: jetstream.FileStorage,
		}); err != nil {
			b.Fatal(err)
		}
		subs := subjects(b.N, true)
		cpu := newCPUMeter(srv)
		cpu.start(b)
		for _, s := range subs {
			m := nats.NewMsg("counters." + s[len("mentions."):])
			m.Header.Set("Nats-Incr", "+1")
			for {
				_, err := js.PublishMsgAsync(m)
				if err == nil {
					break
				}
				<-js.PublishAsyncComplete()
			}
		}
		<-js.PublishAsyncComplete()
		cpu.stop(b)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "mentions/s")
	})
	b.Run("hotcount", func(b *testing.B) {
		srv := natsProcess(b)
		publishCore(b, srv, counterSidecar(b, srv.URL, config.ModeCore))
	})
	// What any consumer of a stream costs: a bare durable consumer, fed
	// by the same publisher as it publishes, acknowledging each message on
	// arrival with nothing counted or kept. The server stores, delivers
	// and takes an ack for every message, where the counters only store.
	// The -ackall and -noack variants bound what fewer acks could gain:
	// one AckAll per 500 messages, and none at all.
	b.Run("bare-consumer", func(b *testing.B) { bareConsumer(b, jetstream.AckExplicitPolicy, 1) })
	b.Run("bare-consumer-ackall", func(b *testing.B) { bareConsumer(b, jetstream.AckAllPolicy, 500) })
	b.Run("bare-consumer-noack", func(b *testing.B) { bareConsumer(b, jetstream.AckNonePolicy, 0) })
	// A consumer with a filter that is not the stream's subject, though it
	// matches every message: what each of partitioned mode's consumers is.
	b.Run("bare-consumer-filtered", func(b *testing.B) { bareConsumer(b, jetstream.AckExplicitPolicy, 1, "mentions.*") })
	// Like for like with the counters: the same acknowledged asynchronous
	// JetStream publishes, into hotcount's stream, counted when every
	// mention is written exactly once (JetStream mode: the stream read
	// without acknowledgements, writes conditional on the items'
	// positions). hotcount's durable paths run at the defaults users get
	// (a 1 s flush interval); -100ms is jetstream mode with
	// --flush-interval 100ms, what the knob buys.
	jetstreamMode := func(tune ...func(*config.Config)) func(b *testing.B) {
		return func(b *testing.B) {
			srv := natsProcess(b)
			nc := testenv.Connect(b, srv.URL)
			if _, err := ingest.EnsureStream(context.Background(), nc, ingest.DefaultStream, "mentions.>", time.Minute); err != nil {
				b.Fatal(err)
			}
			sc := counterSidecar(b, srv.URL, config.ModeJetStream, append([]func(*config.Config){atDefaults}, tune...)...)
			ownsAll(b, sc, 1, "hotcount_ingest_partitions_owned")
			cpu := newCPUMeter(srv)
			publishAcked(b, nc, cpu)
			reportCounted(b, sc, cpu)
		}
	}
	b.Run("hotcount-jetstream", jetstreamMode())
	b.Run("hotcount-jetstream-100ms", jetstreamMode(func(c *config.Config) { c.FlushInterval = 100 * time.Millisecond }))
	// The same in partitioned mode with its default partitions, all owned
	// by the one sidecar: the server's mapping routes each mention into
	// its partition's stream, and each stream's consumer takes it whole.
	b.Run("hotcount-partitioned", func(b *testing.B) {
		srv := natsProcessMapped(b, config.DefaultPartitions)
		nc := testenv.Connect(b, srv.URL)
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := streams.Ensure(context.Background(), js, benchLayout(config.DefaultPartitions), streams.Options{MaxAge: time.Hour, MaxBytes: 1 << 30, Duplicates: time.Minute}); err != nil {
			b.Fatal(err)
		}
		sc := counterSidecar(b, srv.URL, config.ModePartitioned, atDefaults)
		// Publishing starts once the sidecar consumes every partition, as
		// the other consumers do before theirs.
		ownsAll(b, sc, config.DefaultPartitions, "hotcount_ingest_partitions_owned")
		cpu := newCPUMeter(srv)
		publishAcked(b, nc, cpu)
		reportCounted(b, sc, cpu)
	})

}

// atDefaults puts back the flush interval counterSidecar shortens: the
// durable paths of BenchmarkCounters run as a user's sidecar does.
func atDefaults(c *config.Config) { c.FlushInterval = config.Default().FlushInterval }

// ownsAll waits until the sidecar sc (partitioned mode) consumes all
// partitions, as its gauge metric says.
func ownsAll(b *testing.B, sc *sidecar.Sidecar, partitions int, metric string) {
	testenv.Eventually(b, time.Minute, func() error {
		if n := testenv.Metric(b, sc.Registry(), metric); n != float64(partitions) {
			return fmt.Errorf("%v of %d partitions owned", n, partitions)
		}
		return nil
	})
}

// bareConsumer runs a durable consumer of the mentions stream with policy
// (and filter, if one is given), acknowledging every ackEvery-th message
// (and the last) on arrival, while publishAcked publishes b.N mentions, and
// reports mentions/s until the last arrives.
func bareConsumer(b *testing.B, policy jetstream.AckPolicy, ackEvery int64, filter ...string) {
	srv := natsProcess(b)
	nc := testenv.Connect(b, srv.URL)
	ctx := context.Background()
	if _, err := ingest.EnsureStream(ctx, nc, ingest.DefaultStream, "mentions.>", time.Minute); err != nil {
		b.Fatal(err)
	}
	cjs, err := jetstream.New(testenv.Connect(b, srv.URL))
	if err != nil {
		b.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{Durable: "bare", AckPolicy: policy, FilterSubjects: filter}
	if policy != jetstream.AckNonePolicy {
		cfg.MaxAckPending = 100_000 // the previous engine's setting
	}
	cons, err := cjs.CreateOrUpdateConsumer(ctx, ingest.DefaultStream, cfg)
	if err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	all := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if _, err := m.Metadata(); err != nil {
			b.Error(err)
		}
		n := got.Add(1)
		if ackEvery > 0 && (n%ackEvery == 0 || n == int64(b.N)) {
			m.Ack() //nolint:errcheck // a lost ack is a redelivery, counted again: the run takes longer
		}
		if n == int64(b.N) {
			close(all)
		}
	}, jetstream.PullMaxMessages(1000))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	cpu := newCPUMeter(srv)
	publishAcked(b, nc, cpu)
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		b.Fatalf("consumed %d of %d", got.Load(), b.N)
	}
	cpu.stop(b)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "mentions/s")
}

// BenchmarkWindowWrites is what time buckets cost: BenchmarkCounters'
// hotcount path (core publishes of b.N mentions over 1,000 Zipf topics, a
// sidecar on the embedded store, 100 ms flushes) with --windows 1m,1h (the
// default) and none. It reports store writes per mention and mentions/s;
// "none" is the baseline.
func BenchmarkWindowWrites(b *testing.B) {
	for _, windows := range []string{"none", "1m,1h"} {
		name := "windows-" + strings.ReplaceAll(windows, ",", "+")
		b.Run(name, func(b *testing.B) {
			srv := natsProcess(b)
			publishCore(b, srv, counterSidecar(b, srv.URL, config.ModeCore, func(c *config.Config) { c.Windows = windows }))
		})
	}
}

// publishCore starts the timed part, publishes b.N mentions over 1,000
// Zipf topics to srv as core publishes at full speed, and reports once sc
// has flushed them all.
func publishCore(b *testing.B, srv natsServer, sc *sidecar.Sidecar) {
	pub := testenv.Connect(b, srv.URL)
	subs := subjects(b.N, true)
	cpu := newCPUMeter(srv)
	cpu.start(b)
	for _, s := range subs {
		pub.Publish(s, nil) //nolint:errcheck // flushed below
	}
	pub.Flush() //nolint:errcheck // checked by the count
	reportCounted(b, sc, cpu)
}

// publishAcked starts the timed part (cpu.start) and publishes b.N
// mentions over 1,000 Zipf topics as asynchronous JetStream publishes,
// returning when the stream has acknowledged all of them.
func publishAcked(b *testing.B, nc *nats.Conn, cpu *cpuMeter) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	subs := subjects(b.N, true)
	cpu.start(b)
	for _, s := range subs {
		for {
			if _, err := js.PublishAsync(s, nil); err == nil {
				break
			}
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
}

// counterSidecar runs a sidecar on the embedded store against the NATS
// server at url, in mode, until the benchmark ends, and waits until it is
// ready and subscribed.
func counterSidecar(b *testing.B, url, mode string, tune ...func(*config.Config)) *sidecar.Sidecar {
	cfg := config.Default()
	cfg.NATSURL = url
	cfg.NATSMode = mode
	cfg.Store, cfg.DataDir = config.StoreBolt, b.TempDir()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.FlushInterval = 100 * time.Millisecond
	for _, t := range tune {
		t(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	return sidecartest.Run(b, cfg, nil).Sidecar
}

// reportCounted waits until the sidecar has written b.N mentions to the
// store (the durable engine: by position, exactly once). It then ends the
// timed part (cpu.stop: CPU per million mentions) and reports mentions/s
// and store writes per mention, and fails if a mention was counted twice.
func reportCounted(b *testing.B, sc *sidecar.Sidecar, cpu *cpuMeter) {
	flushed := func() float64 { return testenv.Metric(b, sc.Registry(), "hotcount_flusher_flushed_mentions_total") }
	// Every 50 ms, not the 10 of testenv.Eventually's first second: a gather reads the whole
	// registry and /proc (the process collector), and at 100 a second it
	// was a tenth of the CPU this benchmark charges to hotcount. The end
	// is seen at most 50 ms late: under 1% of a run.
	for deadline := time.Now().Add(2 * time.Minute); flushed() < float64(b.N); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%v of %d flushed within 2 minutes", flushed(), b.N)
		}
	}
	cpu.stop(b)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "mentions/s")
	writes := testenv.Metric(b, sc.Registry(), "hotcount_store_writes_total")
	b.ReportMetric(writes/float64(b.N), "writes/mention")
	if f := flushed(); f != float64(b.N) {
		b.Fatalf("%v mentions written for %d published", f, b.N)
	}
}
