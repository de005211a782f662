package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/pipeline/httpapi"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/shardcount"
	"github.com/hotcount/hotcount/tools/console"
)

// handlers builds the lookup API's listener's handler (with its token
// check) and the admin listener's (health, readiness, metrics, the
// console).
func (s *Sidecar) handlers(p *parts, stopping *atomic.Bool) (map[string]http.Handler, error) {
	cfg, reg := s.cfg, s.reg
	// What liveness follows, for alerts: the last flush that wrote
	// something or had nothing to write (the start, before any).
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_flusher_last_progress_timestamp_seconds",
		Help: "Time of the last flush that wrote something or had nothing to write (the start, before any): /healthz fails when it is older than --health-flush-age.",
	}, func() float64 { return float64(p.out.LastProgress().UnixNano()) / 1e9 }))
	// What alerts follow besides: a flush refused for good only is
	// progress for liveness (a restart mends nothing), not a write.
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_flusher_last_write_timestamp_seconds",
		Help: "Time of the last flush that applied a write or had nothing to write (the start, before any): unlike last_progress, a flush whose every write the store refused for good (a policy that lost dynamodb:UpdateItem) does not move it. HotcountStoreRefusesWrites follows it.",
	}, func() float64 { return float64(p.out.LastWrite().UnixNano()) / 1e9 }))
	health := func(context.Context) error {
		if age := time.Since(p.out.LastProgress()); age > cfg.HealthAge() {
			return fmt.Errorf("no flush has written anything for %s, more than %s", age.Round(time.Millisecond), cfg.HealthAge())
		}
		return nil
	}
	// Readiness is "the lookup API can answer" (from the store, or from
	// its cache while the store is away): a native sidecar's readiness is
	// its app pod's, and a NATS blip or a slow table must not take every
	// app pod out of its Service. The dependencies' state is in /healthz's
	// body and in hotcount_dependency_up.
	ready := func(context.Context) error {
		if stopping.Load() {
			return errors.New("shutting down")
		}
		return nil
	}
	deps := s.dependencies(map[string]httpapi.Check{
		"nats":  func(context.Context) error { return p.sub.Ready() },
		"store": p.st.Ping,
	})

	// The durable quarantine's counters, which a restart would not mend:
	// in the body, not the verdict.
	var status httpapi.Status
	if p.eng != nil {
		status = func() map[string]any {
			held, limit := p.eng.Held()
			return map[string]any{"quarantine": map[string]any{"heldCounters": held, "limitPerStream": limit}}
		}
	}
	adminMux := http.NewServeMux()
	adminMux.Handle("/", httpapi.Admin(reg, health, ready, deps, status))
	adminMux.Handle(console.Path, p.con)
	adminMux.Handle(console.Path+"/", p.con)
	api := p.api
	var token string
	if cfg.HTTPTokenFile != "" {
		var err error
		if token, err = config.ReadToken(cfg.HTTPTokenFile); err != nil {
			return nil, fmt.Errorf("sidecar: --http-token-file: %w", err)
		}
		api = httpapi.RequireToken(token, api)
	}
	if cfg.Pprof {
		// Profiles name the code and its memory: this machine's, or the
		// token holder's, like the console's data.
		adminMux.Handle("/debug/pprof/", httpapi.LocalOnly(profiles(), token,
			"/debug/pprof is served to this machine only (kubectl port-forward), or with --http-token-file to requests that carry the token"))
	}
	return map[string]http.Handler{"http": api, "admin": adminMux}, nil
}

// profiles is net/http/pprof's handlers, on a mux of their own: the
// package's init registers them on http.DefaultServeMux, which hotcount
// never serves. A profile longer than the listener's write timeout is
// served whole: pprof moves the answer's deadline past it. Not cmdline:
// the command line may carry --nats-token or a URL's password, which
// hotcount never prints.
func profiles() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// dependencies exports each check as hotcount_dependency_up and returns
// what /healthz's body says of them.
func (s *Sidecar) dependencies(checks map[string]httpapi.Check) func(context.Context) map[string]string {
	for name, check := range checks {
		s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "hotcount_dependency_up",
			Help:        "1 while the dependency answers (nats: subscribed, or the streams read, and connected; store: a call succeeded lately or the table answers), else 0.",
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
	return func(ctx context.Context) map[string]string {
		out := make(map[string]string, len(checks))
		for name, check := range checks {
			out[name] = "ok"
			if err := check(ctx); err != nil {
				out[name] = err.Error()
			}
		}
		return out
	}
}

// listeners are the lookup API's and the admin listener's servers, bound.
type listeners struct {
	servers []*server
	serving sync.WaitGroup
	// failed receives the error of a server that stopped on its own.
	failed chan error
}

// start serves every listener, each on a goroutine that shutdown joins.
func (l *listeners) start() {
	for _, srv := range l.servers {
		l.serving.Go(func() {
			if err := srv.serve(); !errors.Is(err, http.ErrServerClosed) {
				l.failed <- fmt.Errorf("sidecar: serve %s: %w", srv.name, err)
			}
		})
	}
}

// shutdown stops every listener, closing those whose requests outlast ctx.
func (l *listeners) shutdown(ctx context.Context) error {
	for _, srv := range l.servers {
		if err := srv.Shutdown(ctx); err != nil {
			srv.Close()
		}
	}
	l.serving.Wait()
	return nil
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
func (s *Sidecar) listen(handlers map[string]http.Handler) (*listeners, error) {
	addrs := map[string]string{"http": s.cfg.HTTPAddr, "admin": s.cfg.AdminAddr}
	l := &listeners{failed: make(chan error, len(addrs))}
	for _, name := range []string{"http", "admin"} {
		ln, err := net.Listen("tcp", addrs[name])
		if err != nil {
			for _, srv := range l.servers {
				srv.ln.Close()
			}
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("sidecar: --%s %s is in use by another process (another hotcount?): stop it, or choose another --%s: %w", name, addrs[name], name, err)
			}
			return nil, fmt.Errorf("sidecar: listen --%s %s: %w", name, addrs[name], err)
		}
		l.servers = append(l.servers, &server{name: name, ln: ln, Server: &http.Server{
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
	s.httpAddr, s.adminAddr = l.servers[0].ln.Addr(), l.servers[1].ln.Addr()
	return l, nil
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
func raisesOf(book *shardcount.Book) func(topic string) []console.Raise {
	return func(topic string) []console.Raise {
		var out []console.Raise
		for _, r := range book.History(topic) {
			out = append(out, console.Raise{At: r.At.UnixMilli(), From: r.From, To: r.To, Here: r.Here})
		}
		return out
	}
}
