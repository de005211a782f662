package durable_test

// What a stream's own history can do under the engine: drop mentions by
// its limits, or go back to a backup.

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// Mentions that a stream's max age drops before any reader read them are
// lost, and counted as such, even when the stream aged out everything
// (FirstSeq = LastSeq+1, no message left).
func TestRetentionLossIsCounted(t *testing.T) {
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}, MaxAge: time.Second}); err != nil {
		t.Fatal(err)
	}
	e := &env{nc: nc, js: js, db: testenv.StartDynalite(t)}
	e.table = e.db.Table(t, "hotcount")
	want := map[string]int64{}
	e.publish(t, 10, 1, want)
	testenv.Eventually(t, 10*time.Second, func() error {
		st, err := js.Stream(context.Background(), "MENTIONS")
		if err != nil {
			return err
		}
		if s := st.CachedInfo().State; s.Msgs != 0 || s.FirstSeq != 11 {
			return fmt.Errorf("not aged out yet: %+v", s)
		}
		return nil
	})
	s := e.start(t, e.store(e.db.Endpoint))
	testenv.Eventually(t, 10*time.Second, func() error { return s.Ready() })
	testenv.Eventually(t, 10*time.Second, func() error { // the reader starts, and says what it found
		if n := testenv.Metric(t, s.reg, "hotcount_durable_retention_lost_total"); n != 10 {
			return fmt.Errorf("10 mentions aged out before any reader read them; hotcount_durable_retention_lost_total = %v", n)
		}
		return nil
	})
}

// A stream restored from a backup keeps its creation time (nats-server
// restoreStream: mset.setCreatedTime(fcfg.Created)), so its epoch is the
// old one while its sequences start again below what the items and the
// checkpoint record. Here the stream's directory is put back as it was at
// sequence 50 after the engine counted 1..100: its new mentions
// (sequences 51..80 again) would read as counted. The engine refuses to
// read it, says so, and counts nothing twice; the new mentions stay in
// the stream.
func TestRestoredStreamIsRefused(t *testing.T) {
	// 30 mentions after the restore end it below the checkpoint (100); 60
	// end it past the checkpoint, where only the high-water mark's message
	// (published before the backup, a new one now) tells.
	for _, more := range []int{30, 60} {
		t.Run(fmt.Sprint(more), func(t *testing.T) { restoredStream(t, more) })
	}
}

// restoredStream restores a stream of 50 mentions under a table that
// counted 100, publishes more mentions into it, and starts a reader.
func restoredStream(t *testing.T, more int) {
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{nc: nc, js: js, db: testenv.StartDynalite(t)}
	e.createStream(t)
	e.table = e.db.Table(t, "hotcount")
	want := map[string]int64{}
	e.publish(t, 50, 1, want)

	// A backup of the stream at sequence 50 (server stopped: a consistent copy).
	dir := srv.JetStreamConfig().StoreDir
	created := func() time.Time {
		st, err := js.Stream(context.Background(), "MENTIONS")
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Created
	}
	before := created()
	srv = testenv.RestartNATS(t, srv) // flushes to disk
	var streamDir string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "MENTIONS" && filepath.Base(filepath.Dir(p)) == "streams" {
			streamDir = p
		}
		return nil
	})
	if streamDir == "" {
		t.Fatal("no stream directory")
	}
	port := srv.Addr().(*net.TCPAddr).Port
	srv.Shutdown()
	srv.WaitForShutdown()
	backup := t.TempDir()
	if out, err := exec.Command("cp", "-a", streamDir, backup).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	srv = restart(t, port, dir)
	testenv.Eventually(t, 10*time.Second, func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected")
		}
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	s := e.run(t, ctx, e.store(e.db.Endpoint), nil)
	e.publish(t, 50, 1, want) // sequences 51..100
	e.exact(t, want)
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := testenv.Metric(t, s.reg, "hotcount_durable_checkpoint_sequence"); n != 100 {
			return fmt.Errorf("checkpoint %v", n)
		}
		return nil
	})
	cancel() // this sidecar stops

	// The operator restores the stream from the backup.
	port = srv.Addr().(*net.TCPAddr).Port
	srv.Shutdown()
	srv.WaitForShutdown()
	if err := os.RemoveAll(streamDir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", filepath.Join(backup, "MENTIONS"), filepath.Dir(streamDir)).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	restart(t, port, dir) // the restored stream's server, stopped by the test's cleanup
	testenv.Eventually(t, 10*time.Second, func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected")
		}
		return nil
	})
	if after := created(); !after.Equal(before) {
		t.Logf("the restored stream has a new creation time: %v, was %v", after, before)
	} else {
		t.Logf("the restored stream keeps its creation time %v: the same epoch", after)
	}
	st, _ := js.Stream(context.Background(), "MENTIONS")
	t.Logf("restored stream state: %+v", st.CachedInfo().State)

	e.publish(t, more, 1, map[string]int64{}) // sequences 51.. of the restored stream
	s2 := e.start(t, e.store(e.db.Endpoint))
	testenv.Eventually(t, 15*time.Second, func() error {
		if n := testenv.Metric(t, s2.reg, "hotcount_durable_backwards_total"); n == 0 {
			return fmt.Errorf("the restore is not reported")
		}
		return nil
	})
	if n := testenv.Metric(t, s2.reg, "hotcount_ingest_events_total"); n != 0 {
		t.Errorf("%v mentions read from a stream whose sequences went back", n)
	}
	got, _ := e.db.Counts(t, e.table)
	if got["topic-0"] != 100 {
		t.Errorf("topic-0: %d, want the 100 counted before the restore", got["topic-0"])
	}
}

// restart starts a server again on port and dir (the one before it has
// been shut down).
func restart(t *testing.T, port int, dir string) *server.Server {
	t.Helper()
	s, err := embeddednats.Start(port, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}
