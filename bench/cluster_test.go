package bench_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// A cluster node's server mode (TestMain, clusterNode): its server name,
// its cluster (route) port and the routes to every node, comma-separated.
const nameEnv, clusterPortEnv, routesEnv = "HC_BENCH_NATS_NAME", "HC_BENCH_NATS_CLUSTER_PORT", "HC_BENCH_NATS_ROUTES"

// clusterNode is embeddednats.Start for a node of a cluster on 127.0.0.1,
// named by nameEnv, taking routes on clusterPortEnv and routing to
// routesEnv, with JetStream storing in storeDir.
func clusterNode(port int, storeDir string, mappings map[string]string) (*server.Server, error) {
	cport, err := strconv.Atoi(os.Getenv(clusterPortEnv))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", clusterPortEnv, err)
	}
	opts := &server.Options{
		ServerName: os.Getenv(nameEnv),
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true,
		NoLog:      true,
		Cluster:    server.ClusterOpts{Name: "hotcount-bench", Host: "127.0.0.1", Port: cport},
		Routes:     server.RoutesFromStr(os.Getenv(routesEnv)),
	}
	if opts.Accounts, err = embeddednats.Accounts(mappings); err != nil {
		return nil, err
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("cluster node %s on port %d not ready within 30s", opts.ServerName, port)
	}
	return s, nil
}

// natsCluster starts an n-node NATS cluster on 127.0.0.1, every node a
// child process (startNATS) with its own store and partitioned mode's
// mapping into partitions partition streams, and waits until JetStream
// answers.
func natsCluster(b *testing.B, n, partitions int) []natsServer {
	ports := make([]string, n)
	routes := make([]string, n)
	for i := range n {
		ports[i] = strconv.Itoa(freePort(b))
		routes[i] = "nats://127.0.0.1:" + ports[i]
	}
	srvs := make([]natsServer, n)
	for i := range n {
		srvs[i] = startNATS(b, partitionsEnv+"="+strconv.Itoa(partitions), nameEnv+"=n"+strconv.Itoa(i),
			clusterPortEnv+"="+ports[i], routesEnv+"="+strings.Join(routes, ","))
	}
	js, err := jetstream.New(testenv.Connect(b, clusterURLs(srvs)))
	if err != nil {
		b.Fatal(err)
	}
	testenv.Eventually(b, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err
	})
	return srvs
}

// clusterURLs is every server's URL, comma-separated, as a client is
// given a cluster.
func clusterURLs(srvs []natsServer) string {
	urls := make([]string, len(srvs))
	for i, s := range srvs {
		urls[i] = s.URL
	}
	return strings.Join(urls, ",")
}

// BenchmarkClusterPartitions is partitioned mode on a NATS cluster: three
// servers, each a process of its own on 127.0.0.1 storing in a folder of
// its own, the partition streams at R3 (streams.Ensure) with their leaders
// spread over the servers (streams.Spread), one sidecar owning every
// partition (publishing starts once it does), and BenchmarkCounters'
// acknowledged asynchronous publisher: b.N mentions over 1,000 Zipf
// topics, counted when every mention is written and its message
// acknowledged. "8-streams" has 8 partitions, "1-stream" 1. The publisher
// and the sidecar are given every server's URL, as a deployment's clients
// are, and each connects to one of them at random (so a partition's
// messages cross a route to its leader, or not).
//
// It reports mentions/s; max-leaders-per-server, the most partition
// leaders one server holds once spread (3 of 8 is even; 1 of 1 cannot be
// spread); server-cpu-s/M, the three servers' CPU seconds per million
// mentions, summed; process-cpu-s/M, this process's (the publisher and the
// sidecar); and cores-busy, all that CPU over the elapsed time.
//
// The machine this runs on has 2 cores, and the three servers, the sidecar
// and the publisher share them, so it cannot show scaling: that 8 streams,
// their leaders on 3 servers with cores of their own, take about 3 times
// what 1 stream takes, or what a server's share of the leaders lets it
// reach. Nor does it show a real network: routes over loopback have no
// bandwidth limit and microseconds of latency, where replication between
// machines or zones waits for round trips that cost nothing here; nor
// several sidecars, since one owns every partition.
//
// What it can show: what the cluster costs at R3, in server-cpu-s/M (an
// amount of work, which shared cores do not change much) against
// BenchmarkCounters/hotcount-partitioned's one server at R1: each mention
// stored three times and replicated through a Raft group, its ack and
// the consumer's acks too. And whether 8 streams beat 1 when the cores are
// shared: 8 Raft groups and 8 consumers overlap their round trips, 1
// serialises them on one leader, but 8 cost more per-group overhead. With
// cores-busy near the cores, the run is CPU-bound and mentions/s follows the
// CPU per mention; well below, it waits on round trips, and more streams
// may help even here. Other work on the machine takes cores unseen here.
func BenchmarkClusterPartitions(b *testing.B) {
	for _, c := range []struct {
		name       string
		partitions int
	}{{"8-streams", 8}, {"1-stream", 1}} {
		b.Run(c.name, func(b *testing.B) { clusterRun(b, c.partitions) })
	}
}

// clusterRun is one BenchmarkClusterPartitions case.
func clusterRun(b *testing.B, partitions int) {
	const nodes, replicas = 3, 3
	ctx := context.Background()
	l := benchLayout(partitions)
	srvs := natsCluster(b, nodes, partitions)
	urls := clusterURLs(srvs)
	nc := testenv.Connect(b, urls)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	// Until every server has joined JetStream's meta group, an R3 stream
	// may be refused (too few servers): Ensure creates what is missing.
	testenv.Eventually(b, time.Minute, func() error {
		_, err := streams.Ensure(ctx, js, l, streams.Options{MaxAge: time.Hour, MaxBytes: 1 << 30, Duplicates: time.Minute, Replicas: replicas})
		return err
	})
	leaders := func() map[string]int {
		var load map[string]int
		testenv.Eventually(b, time.Minute, func() error {
			ps, err := streams.Status(ctx, js, l.Names())
			if err != nil {
				return err
			}
			for _, p := range ps {
				if p.Leader == "" {
					return fmt.Errorf("%s has no leader", p.Stream)
				}
			}
			load = streams.Leaders(ps)
			return nil
		})
		return load
	}
	leaders() // every stream led, so that Spread sees them all
	spread, err := streams.Spread(ctx, nc, js, l, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	sc := counterSidecar(b, urls, config.ModePartitioned, func(c *config.Config) { c.Partitions = partitions })
	ownsAll(b, sc, partitions, "hotcount_ingest_partitions_owned")
	cpu := newCPUMeter(srvs...)
	publishAcked(b, nc, cpu)
	reportCounted(b, sc, cpu)
	b.ReportMetric(float64(maxLeaders(spread)), "max-leaders-per-server")
	if cpu.noServer == nil {
		b.ReportMetric((cpu.server+cpu.process).Seconds()/b.Elapsed().Seconds(), "cores-busy")
	}
	if after := leaders(); maxLeaders(after) != maxLeaders(spread) {
		b.Logf("partition leaders moved during the run: %v before, %v after", spread, after)
	}
}

// maxLeaders is the most partition leaders one server holds.
func maxLeaders(load map[string]int) int {
	most := 0
	for _, n := range load {
		most = max(most, n)
	}
	return most
}
