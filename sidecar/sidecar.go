// Package sidecar wires the stages into the running sidecar: NATS ingest
// into the aggregator, the flusher into the store, the lookup API and the
// admin listener, and the shutdown that drains, flushes and stops them in
// that order.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/internal/waits"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/shardcount"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/pipeline/trend"
	"github.com/hotcount/hotcount/schema"
)

// Store is a store as the sidecar uses it: both implementations satisfy it.
type Store interface {
	flusher.Store
	lookup.Store
	shardcount.Store
	trend.Store
	// Records is for `hotcount audit` (audit.Table).
	Records(ctx context.Context, keys []string) (map[string][]store.Record, error)
	Ping(ctx context.Context) error
	Close() error
}

// Sidecar is one running hotcount. New builds it; Run runs it until its
// context ends, then shuts it down.
type Sidecar struct {
	cfg config.Config
	log *zap.Logger
	reg *prometheus.Registry
	// clock is what puts mentions in time buckets and what windows end
	// at: time.Now, or a test's (WithClock).
	clock func() time.Time

	started             chan struct{}
	httpAddr, adminAddr net.Addr
}

// Option is an optional setting of New.
type Option func(*Sidecar)

// WithClock has the time buckets and the windowed reads follow now instead
// of time.Now (core mode: JetStream buckets mentions by their publication):
// a test steps it through hours in seconds.
func WithClock(now func() time.Time) Option { return func(s *Sidecar) { s.clock = now } }

// New returns a sidecar for cfg, which must have passed Validate.
func New(cfg config.Config, log *zap.Logger, opts ...Option) *Sidecar {
	s := &Sidecar{cfg: cfg, log: log, reg: prometheus.NewRegistry(), started: make(chan struct{}), clock: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Started is closed once the listeners are bound and the pipeline runs.
func (s *Sidecar) Started() <-chan struct{} { return s.started }

// HTTPAddr is the lookup API's bound address, once Started.
func (s *Sidecar) HTTPAddr() string { return s.httpAddr.String() }

// AdminAddr is the admin listener's bound address, once Started.
func (s *Sidecar) AdminAddr() string { return s.adminAddr.String() }

// Registry is the sidecar's metrics registry, served on /metrics.
func (s *Sidecar) Registry() *prometheus.Registry { return s.reg }

// OpenStore opens the store cfg names.
// A global table's Regions are resolved first (Regions), logged on log.
func OpenStore(ctx context.Context, cfg config.Config, m *store.Metrics, log *zap.Logger) (Store, error) {
	if cfg.Store == config.StoreBolt {
		return store.OpenBolt(cfg.DataDir, m)
	}
	client, err := store.NewDynamoDBClient(ctx, cfg.DynamoDBEndpoint)
	if err != nil {
		return nil, err
	}
	d := store.NewDynamoDB(client, cfg.Table, m)
	d.Retention = schema.Retention{Minute: cfg.MinuteRetention, Hour: cfg.HourRetention}
	if d.Regions, err = Regions(ctx, cfg, client, log); err != nil {
		return nil, err
	}
	return d, nil
}

// Regions resolves where a DynamoDB store writes and what it reads
// (schema.Regions): the Regions of --regions and of the table's replicas,
// and this sidecar's own, --region or else the SDK's. At AWS's own
// endpoint the table is asked until it answers, unless --region and
// --regions both say it all: guessing "one Region" on a global table
// would lose counts to last-writer-wins. A refusal (no
// dynamodb:DescribeTable) or a missing table ends the asking. At another
// endpoint (dynalite, DynamoDB Local: no global tables, but an emulator
// of one may list replicas) one answer is asked for, and none means no
// replicas.
func Regions(ctx context.Context, cfg config.Config, client *dynamodb.Client, log *zap.Logger) (schema.Regions, error) {
	r := schema.Regions{Own: cfg.Region, All: cfg.RegionList()}
	told := r.Own != "" && len(r.All) > 0
	replicas, err := tableRegions(ctx, cfg, client, told, log)
	var missing *types.ResourceNotFoundException
	switch {
	case errors.As(err, &missing):
		log.Warn("the table does not exist yet: its Regions are --regions' only", zap.String("table", cfg.Table))
	case err != nil && (told || cfg.DynamoDBEndpoint != ""):
		log.Warn("the table's replicas unknown (DescribeTable failed); reading the Regions of --regions only", zap.Error(err))
	case err != nil:
		return r, fmt.Errorf("sidecar: cannot tell whether table %s is global (set --region and --regions, or allow dynamodb:DescribeTable): %w", cfg.Table, err)
	}
	r.All = append(r.All, replicas...)
	sdk := client.Options().Region
	switch {
	case r.Own == "" && len(r.All) > 0 && cfg.DynamoDBEndpoint != "":
		// No SDK Region to trust here: every emulated Region's clients
		// share one, and two Regions writing as one lose counts.
		return r, errors.New("sidecar: the table has several Regions: set --region, the Region of the replica at --dynamodb-endpoint")
	case r.Own == "" && len(r.All) > 0:
		r.Own = sdk
		if err := schema.ValidateRegion(r.Own); err != nil {
			return r, fmt.Errorf("sidecar: the table is global, and the SDK's Region is not valid for --region: %w", err)
		}
	case r.Own != "" && cfg.DynamoDBEndpoint == "" && sdk != r.Own:
		// It would write r.Own's items in the SDK Region's replica,
		// beside the real r.Own's sidecars writing them in theirs.
		return r, fmt.Errorf("sidecar: --region %s, but the SDK calls DynamoDB in %s (AWS_REGION): a Region writes only its own replica", r.Own, sdk)
	}
	if r.Active() && !slices.Contains(r.All, r.Own) && len(replicas) > 0 {
		log.Warn("this sidecar's Region is not among the table's replicas: no other Region reads what it writes", zap.String("region", r.Own), zap.Strings("replicas", replicas))
	}
	if r.Active() {
		log.Info("multi-Region: writing this Region's shards, reading every Region's", zap.String("region", r.Own), zap.Strings("regions", r.All))
	}
	return r, nil
}

// tableRegions asks DescribeTable for the table's replicas: until it
// answers at AWS's own endpoint, unless told already holds the answer;
// once elsewhere. A refusal or a missing table is not asked again.
func tableRegions(ctx context.Context, cfg config.Config, client *dynamodb.Client, told bool, log *zap.Logger) ([]string, error) {
	tries := []backoff.RetryOption{backoff.WithBackOff(waits.ControlPlane()), backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, wait time.Duration) {
			log.Warn("cannot tell whether the table is global yet", zap.Error(err), zap.Duration("retry_in", wait))
		})}
	if told || cfg.DynamoDBEndpoint != "" {
		tries = []backoff.RetryOption{backoff.WithMaxTries(1)}
	}
	return backoff.Retry(ctx, func() ([]string, error) {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		regions, err := store.TableRegions(tctx, client, cfg.Table)
		var missing *types.ResourceNotFoundException
		if errors.As(err, &missing) || errors.Is(err, store.ErrDenied) {
			return nil, backoff.Permanent(err)
		}
		return regions, err
	}, tries...)
}

// Run runs the sidecar until ctx ends (SIGTERM) or a part fails, then shuts
// down within --shutdown-timeout: stop taking messages and drain the NATS
// subscription (at most --drain-timeout), stop the flush loop, leave the
// fleet (partitioned mode), flush what is buffered (retrying until the
// budget's end less a reserve), send what is published, close NATS, stop the HTTP listeners, then the lookup's
// background work. The lookup API keeps answering until the final flush
// is done.
func (s *Sidecar) Run(ctx context.Context) error {
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p, err := s.assemble(ctx)
	if err != nil {
		return err
	}
	defer p.close()
	var stopping atomic.Bool
	handlers, err := s.handlers(p, &stopping)
	if err != nil {
		return err
	}
	l, err := s.listen(handlers)
	if err != nil {
		return err
	}

	// The services (the read side's loops, and the fleet's membership)
	// run on a context of their own, which ends only after the HTTP
	// listeners have stopped, the last phase of the shutdown: the lookup
	// API answers, refreshing its cache, until then. They start before
	// the listeners serve.
	services, sctx, stopServices := goAll(p.services)
	defer stopServices()
	leaveFleet := runMembers(sctx, p.members, services)
	l.start()

	// The pipeline runs on its own context: the shutdown stops it step by
	// step rather than all at once.
	pipe, pctx, stopPipe := goAll(p.runs)
	defer stopPipe()

	close(s.started)
	s.logStarted(p)

	var cause error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", zap.Duration("budget", s.cfg.ShutdownTimeout))
	case <-pctx.Done():
		s.log.Error("pipeline stopped; shutting down")
	case <-sctx.Done():
		s.log.Error("a service stopped; shutting down")
	case cause = <-l.failed:
		s.log.Error("listener failed; shutting down", zap.Error(cause))
	}
	stopping.Store(true)
	err = shutdown{
		budget:  s.cfg.ShutdownTimeout,
		reserve: s.cfg.ShutdownReserve(),
		stop:    pipelineStop{stop: stopPipe, endBy: p.out.EndBy, cut: p.cut, wait: pipe.Wait, leave: leaveFleet}.run,
		final:   p.out.Final, // returned below, with what it could not write
		after:   s.afterFinal(p, l),
	}.run(s.log)
	// The HTTP listeners have stopped: nothing reads any more.
	stopServices()
	return errors.Join(cause, err, services.Wait())
}

// goAll runs each of runs on one errgroup, on a context of its own that
// stop ends, and that ends too when one of them fails.
func goAll(runs []func(context.Context) error) (g *errgroup.Group, ctx context.Context, stop context.CancelFunc) {
	parent, stop := context.WithCancel(context.Background())
	g, ctx = errgroup.WithContext(parent)
	for _, run := range runs {
		g.Go(func() error { return run(ctx) })
	}
	return g, ctx, stop
}

// logStarted says where the running sidecar listens and what it reads.
func (s *Sidecar) logStarted(p *parts) {
	s.log.Info("started",
		zap.String("http", s.HTTPAddr()), zap.String("admin", s.AdminAddr()),
		zap.String("nats", p.nc.ConnectedUrlRedacted()), zap.String("subject", s.cfg.Subject),
		zap.String("mode", s.cfg.NATSMode), zap.String("store", s.cfg.Store), zap.Int("shards", s.cfg.Shards),
		zap.String("writer", p.out.Writer()))
}

// runMembers runs the fleet's membership, if any (partitioned mode), on
// services, and returns what makes it leave the fleet and waits until it
// has (or until the context given to leave ends). It has a context of its
// own, ended by that leave, neither the pipeline's nor the services': the
// shutdown cancels the pipeline first, and the drain that follows keeps
// this sidecar's partitions pinned to it, so it must keep announcing
// itself meanwhile, or the others would find it silent and claim
// partitions it still drains; and it must leave once the drain is done,
// well before the services stop after the HTTP listeners, so that the
// others take its partitions while its final flush writes. Not even a
// failure of the other services ends it before the drain: the sidecar
// shuts down then, in this order.
func runMembers(sctx context.Context, members *fleet.Members, services *errgroup.Group) (leave func(context.Context)) {
	if members == nil {
		return func(context.Context) {}
	}
	fleetCtx, stop := context.WithCancel(context.WithoutCancel(sctx))
	done := make(chan struct{})
	services.Go(func() error {
		defer close(done)
		if err := members.Run(fleetCtx); err != nil {
			return fmt.Errorf("sidecar: join the fleet: %w", err)
		}
		return nil
	})
	return func(ctx context.Context) {
		stop()
		select {
		case <-done:
		case <-ctx.Done(): // services.Wait joins it
		}
	}
}

// afterFinal are the phases of the shutdown after the final flush.
func (s *Sidecar) afterFinal(p *parts, l *listeners) []phase {
	return []phase{
		// Publishes are asynchronous (dead letters, the fleet's summaries):
		// make sure they have left before the connection closes.
		{"flushing publishes to NATS", p.nc.FlushWithContext},
		{"closing NATS", func(context.Context) error { p.nc.Close(); return nil }},
		{"stopping the HTTP listeners", l.shutdown},
	}
}
