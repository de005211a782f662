package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"time"
)

// dynaliteStartTimeout bounds how long StartDynalite waits for dynalite to
// listen.
const dynaliteStartTimeout = 20 * time.Second

// StartDynalite starts the dynalite at bin (a local DynamoDB API in
// Node.js, as test/dynalite installs it), in memory on a free port of
// 127.0.0.1, with its errors to stderr. It returns the endpoint once
// dynalite takes connections, and stop, which ends it and waits for it to
// exit; the caller must call stop. Ending ctx ends dynalite too.
func StartDynalite(ctx context.Context, bin string, stderr io.Writer) (endpoint string, stop func(), err error) {
	// dynalite's own --port 0 means its default, 4567: find a free port
	// here. Another process may take it before dynalite does; then
	// dynalite exits and this says so.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("demo: free port: %w", err)
	}
	addr := ln.Addr().String()
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	cmd := exec.CommandContext(ctx, bin, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--createTableMs", "0")
	cmd.Stderr = stderr // its stdout only says where it listens
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("demo: start dynalite: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop = func() {
		cmd.Process.Kill() //nolint:errcheck // it may have exited
		<-exited
	}

	deadline := time.Now().Add(dynaliteStartTimeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return "http://" + addr, stop, nil
		}
		select {
		case <-exited:
			return "", nil, fmt.Errorf("demo: dynalite (%s) exited before listening on %s: %s", bin, addr, cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("demo: dynalite (%s) did not listen on %s within %s", bin, addr, dynaliteStartTimeout)
		}
	}
}
