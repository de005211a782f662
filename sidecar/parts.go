package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/heavyhitters"
	"github.com/hotcount/hotcount/pipeline/httpapi"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/pipeline/shardcount"
	"github.com/hotcount/hotcount/pipeline/spill"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/pipeline/trend"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/console"
)

// parts are a sidecar's stages, built and connected but not yet running.
// Only Run's goroutine touches it.
type parts struct {
	st      Store
	nc      *nats.Conn
	im      *ingest.Metrics
	agg     *aggregator.Aggregator // core mode
	hottest *heavyhitters.Tracker
	book    *shardcount.Book
	lk      *lookup.Service
	// seen is what the writer shows the lookup of its writes: told by
	// the one, asked by the other.
	seen    *ownwrites.View
	tr      *trend.Service
	who     ingest.Contributors // who mentioned what, for trending (nil: trending is off)
	fl      *flusher.Flusher    // core mode
	eng     *durable.Engine     // the durable modes
	out     writeStage          // fl or eng
	members *fleet.Members      // partitioned mode only; run by Run, not in runs or services
	sub     source
	// api is the lookup API's handler, without its token check; con is
	// the console, which reads it in-process.
	api http.Handler
	con *console.Console
	// writer is this process's writer id: its marks on the items in core
	// mode, its name in the fleet.
	writer string
	// limit ends when cut is called, which the shutdown does at the final
	// flush's deadline: the pipeline's work that outlives its context
	// stops there (the flush loop's flush in progress), so that a slow
	// store does not hold the shutdown into the reserve of the phases
	// after the final flush.
	limit context.Context
	cut   context.CancelFunc
	// runs are the pipeline's loops, each run until its context ends.
	runs []func(ctx context.Context) error
	// services are the read side's loops (the lookup's refreshes, the
	// totals shared by the fleet), run until the HTTP listeners have
	// stopped: the lookup API answers through the whole shutdown.
	services []func(ctx context.Context) error
	// closers release what was opened, in reverse order.
	closers []func()
}

func (p *parts) onClose(f func()) { p.closers = append(p.closers, f) }

func (p *parts) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

// assemble opens the store and NATS and builds every stage on them. On an
// error it closes what it had opened.
func (s *Sidecar) assemble(ctx context.Context) (*parts, error) {
	limit, cut := context.WithCancel(context.Background())
	p := &parts{writer: store.NewWriterID(), limit: limit, cut: cut}
	p.onClose(cut)
	steps := []func(context.Context, *parts) error{s.openStore, s.buffer, s.connect, s.readers, s.writers, s.ingest, s.views}
	for _, step := range steps {
		if err := step(ctx, p); err != nil {
			p.close()
			return nil, err
		}
	}
	return p, nil
}

// openStore opens the store; one that does not answer yet is not fatal.
func (s *Sidecar) openStore(ctx context.Context, p *parts) error {
	st, err := OpenStore(ctx, s.cfg, store.NewMetrics(s.reg), s.log)
	if err != nil {
		return err
	}
	p.st = st
	p.onClose(func() { st.Close() })
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := st.Ping(pingCtx); err != nil {
		s.log.Warn("store not reachable at start; not ready until it is", zap.Error(err))
	}
	return nil
}

// buffer builds core mode's window with its memory budget and its spill
// folder: a store outage must end in a folder on disk, never in an OOM
// kill that loses the whole buffer. The durable modes have none: the
// engine keeps its own window, and the streams hold what it has not read.
func (s *Sidecar) buffer(_ context.Context, p *parts) error {
	cfg := s.cfg
	if cfg.Durable() {
		return nil
	}
	memBudget := cfg.BufferBudget(debug.SetMemoryLimit(-1))
	var spilled aggregator.Spiller
	if cfg.SpillBudget() > 0 && memBudget > 0 {
		dir := filepath.Join(cfg.DataDir, "spill")
		sp, err := spill.Open(dir, cfg.SpillBudget())
		if err != nil {
			return fmt.Errorf("sidecar: spill folder (--data-dir %s; --spill-max-bytes 0 turns spilling off): %w", cfg.DataDir, err)
		}
		if n, segs := sp.Stats(); segs > 0 {
			s.log.Warn("spilled mentions from an earlier process found; they are written once the store takes writes",
				zap.String("folder", dir), zap.Int64("bytes", n), zap.Int("segments", segs))
		}
		spilled = sp
	}
	opts := []aggregator.Option{aggregator.WithBudget(memBudget, spilled, s.log)}
	if minutes, hours := cfg.Buckets(); minutes || hours {
		opts = append(opts, aggregator.WithBuckets(s.clock))
	}
	p.agg = aggregator.New(cfg.MaxTopics, s.reg, opts...)
	return nil
}

// connect connects to NATS.
func (s *Sidecar) connect(_ context.Context, p *parts) error {
	p.im = ingest.NewMetrics(s.reg)
	auth, err := s.cfg.NATSAuth().Options()
	if err != nil {
		return err
	}
	nc, err := ingest.Connect(s.cfg.NATSURL, s.log, p.im, auth...)
	if err != nil {
		return err
	}
	p.nc = nc
	p.onClose(nc.Close)
	return nil
}

// readers builds the read side: the lookup cache, the trend reader, the
// fleet's trend sketch and the moderation of its list, the hot topics, and
// the shard counts they share with the writers.
func (s *Sidecar) readers(ctx context.Context, p *parts) error {
	cfg := s.cfg
	p.hottest = heavyhitters.New(heavyhitters.DefaultCapacity, heavyhitters.DefaultPeriod, time.Now)
	p.book = shardcount.New(shardcount.Config{Default: cfg.Shards, Adaptive: cfg.Adaptive, Max: cfg.MaxShards, Every: cfg.ShardsCache}, p.st, s.log, s.reg, time.Now)
	lcfg := lookup.Config{
		Shards:        cfg.ReadGuess(),
		CacheTTL:      cfg.CacheTTL,
		CacheStale:    cfg.CacheStaleAge(),
		CacheSize:     cfg.CacheSize,
		MaxTopicBytes: cfg.MaxTopicBytes,
		Share:         cfg.SharesTotals(),
	}
	p.lk = lookup.New(lcfg, p.st, s.reg, time.Now)
	p.seen = ownwrites.New(lookup.ViewConfig(lcfg), time.Now)
	p.lk.SeeWrites(p.seen)
	p.onClose(p.lk.Close)
	p.services = append(p.services, p.lk.Run)
	minutes, hours := cfg.Buckets()
	p.tr = trend.New(trend.Config{
		Minutes:   minutes,
		Hours:     hours,
		Retention: schema.Retention{Minute: cfg.MinuteRetention, Hour: cfg.HourRetention},
		CacheTTL:  cfg.CacheTTL,
		CacheSize: cfg.CacheSize,

		By:              trend.Ranking(cfg.TrendingBy),
		MinContributors: cfg.TrendingMinContributors,
	}, p.st, s.reg, s.clock)
	if minutes {
		// Every sidecar publishes what it wrote and who mentioned it, and
		// merges what all wrote: each ranks the fleet's trending topics
		// from the same summaries.
		sk := trend.NewSketch(p.nc, cfg.TrendSubject, p.writer, s.reg, s.log, s.clock)
		who := trend.NewContributors(s.reg)
		sk.CountContributors(who)
		p.who = who
		if err := sk.Listen(); err != nil {
			return err
		}
		p.services = append(p.services, sk.Run)
		p.tr.UseSketch(sk)
		if err := s.moderate(ctx, p); err != nil {
			return err
		}
	}
	if cfg.SharesTotals() {
		sh := fleet.NewShares(p.nc, cfg.ShareSubject, p.writer, cfg.StoreScope(), p.lk, s.reg, s.log)
		p.services = append(p.services, sh.Run)
		p.lk.ShareWith(sh)
	}
	return nil
}

// writeStage is what the sidecar runs and stops of the stage that writes:
// the flusher (core mode), or the durable engine (the durable modes).
type writeStage interface {
	EndBy(time.Time)
	Final(context.Context) error
	LastProgress() time.Time
	LastWrite() time.Time
	Writer() string
}

// writers builds the stage that writes: in the durable modes the durable
// engine, which reads the streams itself; in core mode the flusher, which
// writes what the subscription buffers.
func (s *Sidecar) writers(_ context.Context, p *parts) error {
	cfg := s.cfg
	minutes, hours := cfg.Buckets()
	observers := []flusher.Observer{p.hottest}
	if minutes {
		observers = append(observers, p.tr) // marks the fleet's history, then feeds the sketch
	}
	if cfg.Durable() {
		return s.engine(p, observers)
	}
	opts := []flusher.Option{flusher.WithObserver(observers...), flusher.WithShards(p.book), flusher.WithView(p.seen)}
	if cfg.QuarantineAfter > 0 {
		q, err := OpenQuarantine(cfg)
		if err != nil {
			return err
		}
		opts = append(opts, flusher.WithQuarantine(q))
	}
	p.fl = flusher.New(flusher.Config{
		Shards:       cfg.Shards,
		Interval:     cfg.FlushInterval,
		Timeout:      cfg.FlushTimeout,
		Concurrency:  cfg.FlushWrites(),
		WriteTimeout: cfg.WriteTimeout,
		Writer:       p.writer,
		Minutes:      minutes,
		Hours:        hours,

		QuarantineAfter: cfg.QuarantineAfter,
	}, p.agg, p.st, s.log, flusher.NewMetrics(s.reg), time.Now, opts...)
	p.out = p.fl
	p.runs = append(p.runs, func(ctx context.Context) error { return p.fl.RunWithin(ctx, p.limit) })
	return nil
}

// engine builds the durable engine: it reads
// the partition streams this sidecar owns and writes them by position.
// The fleet shares the partitions out (one partition, the one stream,
// in jetstream mode), for efficiency only.
func (s *Sidecar) engine(p *parts, observers []flusher.Observer) error {
	cfg := s.cfg
	p.members = fleet.NewMembers(p.nc, fleet.DefaultMembersSubject, p.writer, cfg.Stream+"/positions", fleet.DefaultInterval, s.log)
	minutes, hours := cfg.Buckets()
	dcfg := durable.Config{
		Stream: cfg.Stream, Subject: cfg.Subject,
		Interval: cfg.FlushInterval, WriteTimeout: cfg.WriteTimeout, Concurrency: cfg.FlushWrites(),
		MaxCounters: cfg.MaxTopics, Minutes: minutes, Hours: hours,
		Limits: mention.Limits{MaxCount: cfg.MaxCount, MaxTopicBytes: cfg.MaxTopicBytes, MaxLateness: cfg.Lateness()},
		Table:  cfg.Table, Retention: schema.Retention{Minute: cfg.MinuteRetention, Hour: cfg.HourRetention},
		DeadLetter:      cfg.DeadLetterSubject,
		QuarantineAfter: cfg.QuarantineAfter,
		Contributors:    p.who,
	}
	if cfg.NATSMode == config.ModePartitioned {
		dcfg.Partitions = cfg.Partitions
	}
	if cfg.Store == config.StoreBolt {
		dcfg.Table = "embedded"
	}
	if d, ok := p.st.(*store.DynamoDB); ok {
		dcfg.Region = d.Regions.Own // as resolved: a global table's Region layout
	}
	obs := make([]durable.Observer, len(observers))
	for i, o := range observers {
		obs[i] = o
	}
	eng, err := durable.New(dcfg, p.nc, p.st, p.members, s.log, durable.NewMetrics(s.reg), p.im, time.Now, obs...)
	if err != nil {
		return err
	}
	eng.ShowWrites(p.seen)
	p.eng, p.out, p.sub = eng, eng, eng
	p.runs = append(p.runs, eng.Run)
	return nil
}

// ingest builds what takes mentions from NATS into the window in core
// mode (the durable engine reads its streams itself).
func (s *Sidecar) ingest(ctx context.Context, p *parts) error {
	if p.eng != nil {
		return nil
	}
	cfg := s.cfg
	guard, err := newCoreGuard(ctx, p.nc, cfg.Subject, s.log)
	if err != nil {
		return err
	}
	p.runs = append(p.runs, guard.run)
	sub, err := ingest.NewSubscriber(p.nc, ingest.Config{
		Subject:           cfg.Subject,
		QueueGroup:        cfg.QueueGroup,
		DeadLetterSubject: cfg.DeadLetterSubject,
		DrainTimeout:      cfg.DrainTimeout,
		Limits:            mention.Limits{MaxCount: cfg.MaxCount, MaxTopicBytes: cfg.MaxTopicBytes, MaxLateness: cfg.Lateness()},
		Contributors:      p.who,
	}, p.agg, s.log, p.im)
	if err != nil {
		return err
	}
	p.sub = sub
	p.runs = append([]func(context.Context) error{sub.Run}, p.runs...)
	return nil
}

// views builds what the listeners serve from the stages: the lookup API's
// handler, and the console over it, whose loop (its sampler, its races)
// runs with the pipeline.
func (s *Sidecar) views(_ context.Context, p *parts) error {
	cfg := s.cfg
	p.api = httpapi.Lookup(p.lk, s.log, httpapi.Extras{Pending: true, Hot: p.hottest.Top, ShardsOf: p.book.Cached, Trend: p.tr})
	// The console reads the lookup API in-process, past its token: it
	// guards its own data (loopback only, unless --http-public).
	p.con = console.New(console.Config{API: p.api, WriteShards: p.book.Cached, Metrics: s.reg, Race: cfg.ConsoleRace, CacheTTL: cfg.CacheTTL, Known: knownTopics(p.lk), Raises: raisesOf(p.book), Open: cfg.HTTPPublic && cfg.HTTPTokenFile == ""}, s.log)
	p.runs = append(p.runs, p.con.Run)
	return nil
}

// source is what reads mentions: the core subscription, or the durable
// engine.
type source interface {
	Run(ctx context.Context) error
	Ready() error
}
