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
	"net/http"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/admin"
	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/console"
	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/flusher"
	"github.com/hotcount/hotcount/hot"
	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/lookup"
	"github.com/hotcount/hotcount/peers"
	"github.com/hotcount/hotcount/shards"
	"github.com/hotcount/hotcount/spill"
	"github.com/hotcount/hotcount/store"
	"github.com/hotcount/hotcount/trend"
)

// Store is a store as the sidecar uses it: both implementations satisfy it.
type Store interface {
	flusher.Store
	lookup.Store
	shards.Store
	trend.Store
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
func OpenStore(ctx context.Context, cfg config.Config, m *store.Metrics) (Store, error) {
	if cfg.Store == config.StoreBolt {
		return store.OpenBolt(cfg.DataDir, m)
	}
	client, err := store.NewDynamoDBClient(ctx, cfg.DynamoDBEndpoint)
	if err != nil {
		return nil, err
	}
	d := store.NewDynamoDB(client, cfg.Table, m)
	d.Retention = store.Retention{Minute: cfg.MinuteRetention, Hour: cfg.HourRetention}
	return d, nil
}

// Run runs the sidecar until ctx ends (SIGTERM) or a part fails, then shuts
// down within --shutdown-timeout: stop taking messages and drain the NATS
// subscription (at most --drain-timeout), stop the flush loop, flush what is
// buffered (retrying until the budget ends), close NATS, stop the HTTP
// listeners. The lookup API keeps answering until the final flush is done.
func (s *Sidecar) Run(ctx context.Context) error {
	cfg, log, reg := s.cfg, s.log, s.reg
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	st, err := OpenStore(ctx, cfg, store.NewMetrics(reg))
	if err != nil {
		return err
	}
	defer st.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := st.Ping(pingCtx); err != nil {
		log.Warn("store not reachable at start; not ready until it is", zap.Error(err))
	}
	cancel()

	// The window's memory budget, and in core mode its spill folder: a
	// store outage must end in a paused stream (JetStream) or a folder on
	// disk (core), never in an OOM kill that loses the whole buffer.
	memBudget := cfg.BufferBudget(debug.SetMemoryLimit(-1))
	var spilled aggregator.Spiller
	if cfg.NATSMode == config.ModeCore && cfg.SpillBudget() > 0 && memBudget > 0 {
		dir := filepath.Join(cfg.DataDir, "spill")
		sp, err := spill.Open(dir, cfg.SpillBudget())
		if err != nil {
			return fmt.Errorf("sidecar: spill folder (--data-dir %s; --spill-max-bytes 0 turns spilling off): %w", cfg.DataDir, err)
		}
		if n, segs := sp.Stats(); segs > 0 {
			log.Warn("spilled mentions from an earlier process found; they are written once the store takes writes",
				zap.String("folder", dir), zap.Int64("bytes", n), zap.Int("segments", segs))
		}
		spilled = sp
	}
	aggOpts := []aggregator.Option{aggregator.WithBudget(memBudget, spilled, log)}
	minutes, hours := cfg.Buckets()
	if minutes || hours {
		aggOpts = append(aggOpts, aggregator.WithBuckets(s.clock))
	}
	agg := aggregator.New(cfg.MaxTopics, reg, aggOpts...)
	hottest := hot.New(hot.DefaultCapacity, hot.DefaultPeriod, time.Now)
	book := shards.New(shards.Config{Default: cfg.Shards, Adaptive: cfg.Adaptive, Max: cfg.MaxShards, Every: cfg.ShardsCache}, st, log, reg)
	im := ingest.NewMetrics(reg)
	auth, err := cfg.NATSAuth().Options()
	if err != nil {
		return err
	}
	nc, err := ingest.Connect(cfg.NATSURL, log, im, auth...)
	if err != nil {
		return err
	}
	defer nc.Close()

	lk := lookup.New(lookup.Config{
		Shards:        cfg.ReadGuess(),
		CacheTTL:      cfg.CacheTTL,
		CacheStale:    cfg.CacheStaleAge(),
		CacheSize:     cfg.CacheSize,
		MaxTopicBytes: cfg.MaxTopicBytes,
		Share:         cfg.SharesTotals(),
	}, st, reg, time.Now)
	defer lk.Close()

	// One writer id for this process's writes, journaled or not.
	writer := store.NewWriterID()
	tr := trend.New(trend.Config{
		Minutes:   minutes,
		Hours:     hours,
		Retention: store.Retention{Minute: cfg.MinuteRetention, Hour: cfg.HourRetention},
		CacheTTL:  cfg.CacheTTL,
		CacheSize: cfg.CacheSize,
	}, st, reg, s.clock)
	observers := []flusher.Observer{hottest}
	if minutes {
		// Every sidecar publishes what it wrote and merges what all wrote:
		// each ranks the fleet's trending topics from the same summaries.
		sk, err := trend.JoinSketch(nc, cfg.TrendSubject, writer, reg, log, s.clock)
		if err != nil {
			return fmt.Errorf("sidecar: subscribe to %s: %w", cfg.TrendSubject, err)
		}
		defer sk.Close() //nolint:errcheck // closing
		tr.UseSketch(sk)
		observers = append(observers, tr) // marks the fleet's history, then feeds sk
	}
	opts := []flusher.Option{flusher.WithObserver(observers...), flusher.WithShards(book), flusher.WithReader(lk)}
	var jr *journal.Journal
	if cfg.Durable() {
		if jr, err = openJournal(ctx, nc, cfg, writer, st, log, reg); err != nil {
			return err
		}
		opts = append(opts, flusher.WithJournal(jr))
	}
	var keepAlive time.Duration
	if cfg.Durable() {
		keepAlive = cfg.AckWait / 3 // as the ingest keeps the buffer alive
	}
	fl := flusher.New(flusher.Config{
		Shards:       cfg.Shards,
		Interval:     cfg.FlushInterval,
		Timeout:      cfg.FlushTimeout,
		Concurrency:  cfg.FlushWrites(),
		WriteTimeout: cfg.WriteTimeout,
		Writer:       writer,
		KeepAlive:    keepAlive,
		Minutes:      minutes,
		Hours:        hours,
	}, agg, st, log, flusher.NewMetrics(reg), time.Now, opts...)

	lk.WatchWrites(fl.Sending)
	if cfg.SharesTotals() {
		p, err := peers.Join(nc, cfg.ShareSubject, writer, cfg.StoreScope(), lk, reg, log)
		if err != nil {
			return err
		}
		defer p.Close() //nolint:errcheck // closing
		lk.ShareWith(p)
	}

	// Partitioned mode: the fleet divides the stream's partitions among
	// the sidecars it sees alive.
	var members *fleet.Fleet
	if cfg.NATSMode == config.ModePartitioned {
		if members, err = fleet.Join(nc, fleet.DefaultSubject, writer, cfg.Stream+"/"+cfg.Consumer, fleet.DefaultInterval, log); err != nil {
			return fmt.Errorf("sidecar: join the fleet: %w", err)
		}
		defer members.Leave()
	}
	sub, err := newSource(cfg, nc, agg, fl, members, log, im)
	if err != nil {
		return err
	}
	if js, ok := sub.(*ingest.JetStreamConsumer); ok && jr != nil {
		js.SetJournal(jr)
	}

	// What liveness follows, for alerts: the last flush that wrote
	// something or had nothing to write (the start, before any).
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_flusher_last_progress_timestamp_seconds",
		Help: "Time of the last flush that wrote something or had nothing to write (the start, before any): /healthz fails when it is older than --health-flush-age.",
	}, func() float64 { return float64(fl.LastProgress().UnixNano()) / 1e9 }))
	health := func(context.Context) error {
		if age := time.Since(fl.LastProgress()); age > cfg.HealthAge() {
			return fmt.Errorf("no flush has written anything for %s, more than %s", age.Round(time.Millisecond), cfg.HealthAge())
		}
		return nil
	}
	// Readiness is "the lookup API can answer" (from the store, or from
	// its cache while the store is away): a native sidecar's readiness is
	// its app pod's, and a NATS blip or a slow table must not take every
	// app pod out of its Service. The dependencies' state is in /healthz's
	// body and in hotcount_dependency_up.
	var stopping atomic.Bool
	ready := func(context.Context) error {
		if stopping.Load() {
			return errors.New("shutting down")
		}
		return nil
	}
	checks := map[string]admin.Check{
		"nats":  func(context.Context) error { return sub.Ready() },
		"store": st.Ping,
	}
	deps := func(ctx context.Context) map[string]string {
		out := make(map[string]string, len(checks))
		for name, check := range checks {
			out[name] = "ok"
			if err := check(ctx); err != nil {
				out[name] = err.Error()
			}
		}
		return out
	}
	for name, check := range checks {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "hotcount_dependency_up",
			Help:        "1 while the dependency answers (nats: subscribed or consumer bound, and connected; store: a call succeeded lately or the table answers), else 0.",
			ConstLabels: prometheus.Labels{"dependency": name},
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if check(ctx) != nil {
				return 0
			}
			return 1
		}))
	}

	api := lk.Handler(log, lookup.Extras{Pending: fl.Read, Hot: hottest.Top, ShardsOf: book.Cached, Trend: tr})
	// The console reads the lookup API in-process, past its token: it
	// guards its own data (loopback only, unless --http-public).
	con := console.New(console.Config{API: api, WriteShards: book.Cached, Metrics: reg, Race: cfg.ConsoleRace, CacheTTL: cfg.CacheTTL, Known: knownTopics(lk), Raises: raisesOf(book), Open: cfg.HTTPPublic && cfg.HTTPTokenFile == ""}, log)
	adminMux := http.NewServeMux()
	adminMux.Handle("/", admin.Handler(reg, health, ready, deps))
	adminMux.Handle(console.Path, con)
	adminMux.Handle(console.Path+"/", con)
	if cfg.HTTPTokenFile != "" {
		token, err := config.ReadToken(cfg.HTTPTokenFile)
		if err != nil {
			return fmt.Errorf("sidecar: --http-token-file: %w", err)
		}
		api = lookup.RequireToken(token, api)
	}
	servers, err := s.listen(map[string]http.Handler{
		"http":  api,
		"admin": adminMux,
	})
	if err != nil {
		return err
	}
	serveErr := make(chan error, len(servers))
	var serving sync.WaitGroup
	for _, srv := range servers {
		serving.Go(func() {
			if err := srv.serve(); !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("sidecar: serve %s: %w", srv.name, err)
			}
		})
	}

	// The pipeline runs on its own context: the shutdown below stops it
	// step by step rather than all at once.
	pipeCtx, stopPipe := context.WithCancel(context.Background())
	defer stopPipe()
	pipe, pctx := errgroup.WithContext(pipeCtx)
	pipe.Go(func() error { return sub.Run(pctx) })
	pipe.Go(func() error { return fl.Run(pctx) })
	if jr != nil {
		pipe.Go(func() error { return jr.Run(pctx) })
	}
	pipe.Go(func() error { return con.Run(pctx) })

	close(s.started)
	log.Info("started",
		zap.String("http", s.HTTPAddr()), zap.String("admin", s.AdminAddr()),
		zap.String("nats", nc.ConnectedUrlRedacted()), zap.String("subject", cfg.Subject),
		zap.String("mode", cfg.NATSMode), zap.String("store", cfg.Store), zap.Int("shards", cfg.Shards),
		zap.String("writer", fl.Writer()))

	var cause error
	select {
	case <-ctx.Done():
		log.Info("shutting down", zap.Duration("budget", cfg.ShutdownTimeout))
	case <-pctx.Done():
		log.Error("pipeline stopped; shutting down")
	case cause = <-serveErr:
		log.Error("listener failed; shutting down", zap.Error(cause))
	}
	stopping.Store(true)
	budget, cancelBudget := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancelBudget()

	stopPipe()
	pipeErr := pipe.Wait()
	if members != nil {
		// The drain has unpinned this sidecar's partitions: the others
		// take them now rather than after fleet.Expiry intervals, while
		// the final flush below writes what this one holds.
		members.Leave()
	}
	// The final flush leaves a tenth of the budget (at most a second) for
	// what must follow it: acknowledgements, leaving the journal, HTTP.
	reserve := min(cfg.ShutdownTimeout/10, time.Second)
	finalCtx, cancelFinal := context.WithTimeout(budget, cfg.ShutdownTimeout-reserve)
	finalErr := fl.Final(finalCtx) // returned below, with what it could not write
	cancelFinal()
	if finalErr == nil {
		log.Info("final flush done")
	}
	if jr != nil {
		// No more writes from this writer: what it leaves in the journal
		// is replayed by the others now rather than after its lease.
		if err := jr.Leave(budget); err != nil {
			log.Warn("journal: leaving", zap.Error(err))
		}
	}
	// Acknowledgements are asynchronous publishes: make sure they have left
	// before the connection closes, or their messages come back.
	if err := nc.FlushWithContext(budget); err != nil {
		log.Warn("flushing acknowledgements to NATS", zap.Error(err))
	}
	nc.Close()
	for _, srv := range servers {
		if err := srv.Shutdown(budget); err != nil {
			srv.Close()
		}
	}
	serving.Wait()
	return errors.Join(cause, pipeErr, finalErr)
}

// openJournal opens the JetStream journal, retrying until NATS answers or
// ctx ends.
func openJournal(ctx context.Context, nc *nats.Conn, cfg config.Config, writer string, st Store, log *zap.Logger, reg prometheus.Registerer) (*journal.Journal, error) {
	m := journal.NewMetrics(reg)
	jcfg := journal.Config{Bucket: journal.DefaultBucket, WritersBucket: journal.DefaultWritersBucket, Stream: cfg.Stream, Consumer: cfg.Consumer}
	if cfg.NATSMode == config.ModePartitioned {
		jcfg.Partitions = cfg.Partitions
	}
	backoff := 100 * time.Millisecond
	for {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		jr, err := journal.Open(octx, nc, jcfg, writer, st, log, m)
		cancel()
		if err == nil {
			return jr, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sidecar: %w", err)
		}
		log.Warn("cannot open the journal; retrying", zap.Error(err))
		time.Sleep(backoff)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// source is the ingest, core or JetStream.
type source interface {
	Run(ctx context.Context) error
	Ready() error
}

func newSource(cfg config.Config, nc *nats.Conn, agg *aggregator.Aggregator, fl *flusher.Flusher, members *fleet.Fleet, log *zap.Logger, m *ingest.Metrics) (source, error) {
	icfg := ingest.Config{
		Subject:           cfg.Subject,
		QueueGroup:        cfg.QueueGroup,
		DeadLetterSubject: cfg.DeadLetterSubject,
		DrainTimeout:      cfg.DrainTimeout,
		Limits:            ingest.Limits{MaxCount: cfg.MaxCount, MaxTopicBytes: cfg.MaxTopicBytes},
	}
	if cfg.Durable() {
		jcfg := ingest.JetStreamConfig{
			Stream:        cfg.Stream,
			Consumer:      cfg.Consumer,
			AckWait:       cfg.AckWait,
			MaxAckPending: cfg.MaxAckPending,
		}
		if members != nil {
			jcfg.Partitions, jcfg.Owner = cfg.Partitions, members
		}
		return ingest.NewJetStreamConsumer(nc, icfg, jcfg, agg, func() bool { return fl.Failing() || agg.OverBudget() }, log, m)
	}
	return ingest.NewSubscriber(nc, icfg, agg, log, m)
}

// maxBodyBytes bounds a request body on both listeners.
const maxBodyBytes = 64 << 10

type server struct {
	*http.Server
	name string
	ln   net.Listener
}

func (s *server) serve() error { return s.Serve(s.ln) }

// listen binds both listeners before anything starts, so that a port in use
// fails the start rather than a goroutine later.
func (s *Sidecar) listen(handlers map[string]http.Handler) ([]*server, error) {
	addrs := map[string]string{"http": s.cfg.HTTPAddr, "admin": s.cfg.AdminAddr}
	var out []*server
	for _, name := range []string{"http", "admin"} {
		ln, err := net.Listen("tcp", addrs[name])
		if err != nil {
			for _, srv := range out {
				srv.ln.Close()
			}
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("sidecar: --%s %s is in use by another process (another hotcount?): stop it, or choose another --%s: %w", name, addrs[name], name, err)
			}
			return nil, fmt.Errorf("sidecar: listen --%s %s: %w", name, addrs[name], err)
		}
		out = append(out, &server{name: name, ln: ln, Server: &http.Server{
			// Every endpoint is a GET: a body is never needed, so a large
			// one is refused rather than read.
			Handler:           http.MaxBytesHandler(handlers[name], maxBodyBytes),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    16 << 10,
			ErrorLog:          zap.NewStdLog(s.log.Named(name)),
		}})
	}
	s.httpAddr, s.adminAddr = out[0].ln.Addr(), out[1].ln.Addr()
	return out, nil
}

// knownTopics lists the topics lk caches, for the console's picker.
func knownTopics(lk *lookup.Service) func(limit int) []console.KnownTopic {
	return func(limit int) []console.KnownTopic {
		totals := lk.Known(limit)
		out := make([]console.KnownTopic, len(totals))
		for i, t := range totals {
			out[i] = console.KnownTopic{Topic: t.Topic, Count: t.Count}
		}
		return out
	}
}

// raisesOf gives the console the shard-count raises book made or saw.
func raisesOf(book *shards.Book) func(topic string) []console.Raise {
	return func(topic string) []console.Raise {
		var out []console.Raise
		for _, r := range book.History(topic) {
			out = append(out, console.Raise{At: r.At.UnixMilli(), From: r.From, To: r.To, Here: r.Here})
		}
		return out
	}
}
