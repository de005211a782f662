package testenv

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/internal/embeddednats"
)

// Cluster is a NATS cluster of in-process servers with JetStream, on
// 127.0.0.1, each storing in its own folder: a node can be stopped and
// started again on the same ports and data, as a pod restarts.
type Cluster struct {
	t     testing.TB
	opts  []*server.Options
	nodes []*server.Server // nil while stopped
	// mappings of every node's default account, set again at each start
	// (an account belongs to the server that registered it).
	mappings map[string]string
}

// NATSCluster starts an n-node cluster, each node with mappings (nil:
// none; Partitioned's), and waits until JetStream has a leader. The nodes
// stop when the test ends.
func NATSCluster(t testing.TB, n int, mappings map[string]string) *Cluster {
	t.Helper()
	c := &Cluster{t: t, nodes: make([]*server.Server, n), mappings: mappings}
	routes := make([]string, n)
	clusterPorts := make([]int, n)
	for i := range n {
		clusterPorts[i] = freePort(t)
		routes[i] = "nats://127.0.0.1:" + strconv.Itoa(clusterPorts[i])
	}
	dir := t.TempDir()
	for i := range n {
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       freePort(t),
			JetStream:  true,
			StoreDir:   filepath.Join(dir, fmt.Sprintf("n%d", i)),
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: "hotcount-test", Host: "127.0.0.1", Port: clusterPorts[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		})

	}
	for i := range n {
		c.Start(i)
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.Stop(i)
		}
	})
	c.WaitJetStream()
	return c
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// URLs is the client URL of every node, comma-separated: what a client
// gives nats.Connect to fail over between them.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.opts))
	for i, o := range c.opts {
		urls[i] = "nats://127.0.0.1:" + strconv.Itoa(o.Port)
	}
	return strings.Join(urls, ",")
}

// Start starts node i (again), on its ports and data.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	if c.nodes[i] != nil {
		return
	}
	accounts, err := embeddednats.Accounts(c.mappings)
	if err != nil {
		c.t.Fatal(err)
	}
	c.opts[i].Accounts = accounts
	s, err := server.NewServer(c.opts[i])
	if err != nil {
		c.t.Fatalf("node %d: %v", i, err)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		c.t.Fatalf("node %d not ready", i)
	}
	c.nodes[i] = s
}

// Stop stops node i, as a lost pod.
func (c *Cluster) Stop(i int) {
	if s := c.nodes[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.nodes[i] = nil
	}
}

// Node returns the index of the node named name (a stream's leader, in
// its cluster info).
func (c *Cluster) Node(name string) int {
	for i, o := range c.opts {
		if o.ServerName == name {
			return i
		}
	}
	c.t.Fatalf("no node %q", name)
	return -1
}

// WaitJetStream waits until the cluster's JetStream answers.
func (c *Cluster) WaitJetStream() {
	c.t.Helper()
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	Eventually(c.t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err
	})
}

// Name is node i's server name.
func (c *Cluster) Name(i int) string { return c.opts[i].ServerName }
