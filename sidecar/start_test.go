package sidecar

import (
	"context"
	"errors"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hotcount/hotcount/config"
)

// TestSIGTERMDuringStartReturns starts a JetStream-mode sidecar against a
// NATS server without JetStream, so that opening the journal retries, and
// ends its context meanwhile, as SIGTERM would: Run must return the
// context's error at once, having closed what it had opened, rather than
// sleep through its back-off or fail on what it had not built.
//
// It ends the context just as a retry's back-off sleep begins, once the
// sleeps are long: openJournal's back-off sleeps 100 ms × 1.5^(n-1) after
// the nth failure (at most 5 s), randomized by ±50%, so the sleep under
// way after the retryAt-th failure is at least 0.5 × 100 ms × 1.5^7 =
// 854 ms. Run must return within returnWithin of the cancel, a tenth of
// the back-off's 5 s maximum: waiting out that sleep would take longer.
func TestSIGTERMDuringStartReturns(t *testing.T) {
	const (
		retryAt      = 8
		returnWithin = 500 * time.Millisecond
	)
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	cfg := config.Default()
	cfg.NATSURL = ns.ClientURL()
	cfg.NATSMode = config.ModeJetStream
	cfg.DurableEngine = config.EngineJournal // the journal opens at start; the position engine starts without JetStream and waits in the background
	cfg.Store = config.StoreBolt
	cfg.DataDir = t.TempDir()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Each retry's warning, as it is logged: the back-off sleeps right
	// after it. The observer keeps the log from outliving the test.
	retried := make(chan struct{}, retryAt)
	core, _ := observer.New(zap.WarnLevel)
	log := zap.New(core, zap.Hooks(func(e zapcore.Entry) error {
		if e.Message == "cannot open the journal; retrying" {
			select {
			case retried <- struct{}{}:
			default: // past retryAt: the test has cancelled
			}
		}
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- New(cfg, log).Run(ctx) }()

	for n := 1; n <= retryAt; n++ {
		select {
		case <-retried:
		case err := <-done:
			t.Fatalf("Run returned %v before its context ended (after %d retries)", err, n-1)
		case <-time.After(30 * time.Second):
			t.Fatalf("the journal has been retried %d times in 30 s, want %d", n-1, retryAt)
		}
	}
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		if took := time.Since(cancelled); took > returnWithin {
			t.Errorf("Run returned %s after its context ended, want within %s: it waited out the back-off", took, returnWithin)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want the context's end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still starting 10 s after its context ended")
	}
}
