// Package embeddednats runs a NATS server inside the process, with
// JetStream, for `hotcount dev` and for tests.
package embeddednats

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start starts a NATS server on 127.0.0.1:port (-1: a free port) with
// JetStream storing in storeDir (empty: a temporary folder, removed by the
// server on shutdown only if the caller removes it). Shutdown is the
// caller's: call Shutdown and WaitForShutdown. A port in use fails at once:
// the server itself, with its logs off, would only never become ready.
// mappings are the default account's subject mappings (from: to), as a
// server configuration's top-level mappings block sets them: partitioned
// mode's (streams.Layout.Mapping), or none.
func Start(port int, storeDir string, mappings map[string]string) (*server.Server, error) {
	if port > 0 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("embeddednats: port %d is in use (another NATS server or hotcount dev?): stop it, or choose another with --nats-port: %w", port, err)
		}
		ln.Close()
	}
	opts := &server.Options{
		ServerName: "hotcount-dev",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true, // the process's signals are hotcount's to handle
		NoLog:      true,
	}
	accounts, err := Accounts(mappings)
	if err != nil {
		return nil, err
	}
	opts.Accounts = accounts
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embeddednats: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embeddednats: server on port %d not ready within 10s", port)
	}
	return s, nil
}

// Accounts are the server options' accounts that carry mappings (from: to)
// in the default account, as a configuration's top-level mappings block
// does; none for no mappings. An account belongs to the server that
// registers it: a restarted server needs new ones.
func Accounts(mappings map[string]string) ([]*server.Account, error) {
	if len(mappings) == 0 {
		return nil, nil
	}
	acc := server.NewAccount(server.DEFAULT_GLOBAL_ACCOUNT)
	for from, to := range mappings {
		if err := acc.AddMapping(from, to); err != nil {
			return nil, fmt.Errorf("embeddednats: mapping %s -> %s: %w", from, to, err)
		}
	}
	return []*server.Account{acc}, nil
}
