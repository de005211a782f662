package sidecar

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestSIGTERMDuringStartReturns starts a JetStream-mode sidecar against a
// NATS server without JetStream (a new cluster slow to come up): the
// durable engine waits for its checkpoint bucket, saying so, instead of
// exiting; and a SIGTERM while it waits shuts the sidecar down at once
// and cleanly, rather than after the engine's back-off.
//
// It ends the context once the wait has been logged retryAt times (the
// log says it at most once a second, and the engine's back-off between
// tries has doubled to seconds by then): Run must return within
// returnWithin of the cancel, less than the back-off's 5 s maximum.
func TestSIGTERMDuringStartReturns(t *testing.T) {
	const (
		retryAt      = 4
		returnWithin = 2 * time.Second
	)
	ns := testenv.NATSWithoutJetStream(t)
	cfg := config.Default()
	cfg.NATSURL = ns.ClientURL()
	cfg.NATSMode = config.ModeJetStream
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
		if e.Message == "waiting for JetStream to open the checkpoint bucket" {
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
			t.Fatalf("the wait has been logged %d times in 30 s, want %d", n-1, retryAt)
		}
	}
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		if took := time.Since(cancelled); took > returnWithin {
			t.Errorf("Run returned %s after its context ended, want within %s: it waited out the back-off", took, returnWithin)
		}
		if err != nil {
			t.Errorf("Run returned %v, want a clean shutdown: nothing was read, nothing is lost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still starting 10 s after its context ended")
	}
}
