package testenv

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Split is a TCP proxy between a process and a server that a test can cut
// and heal: a network split, with both sides alive (unlike a kill or a
// freeze). Cut closes every connection through it and refuses new ones
// until Heal.
type Split struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // the accept loop and each connection's pipes
}

// NewSplit proxies a local port to target (host:port) until the test
// ends.
func NewSplit(t testing.TB, target string) *Split {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Split{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	s.wg.Go(s.accept)
	t.Cleanup(func() {
		ln.Close()
		s.Cut()
		s.wg.Wait()
	})
	return s
}

// Addr is the proxy's address, host:port.
func (s *Split) Addr() string { return s.ln.Addr().String() }

// Cut closes every connection through the proxy and refuses new ones.
func (s *Split) Cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut = true
	for c := range s.conns {
		c.Close()
	}
	clear(s.conns)
}

// Heal lets connections through again.
func (s *Split) Heal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut = false
}

func (s *Split) accept() {
	for {
		in, err := s.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		out, err := net.Dial("tcp", s.target)
		if err != nil {
			in.Close()
			continue
		}
		if !s.track(in, out) {
			in.Close()
			out.Close()
			continue
		}
		for _, p := range [][2]net.Conn{{in, out}, {out, in}} {
			s.wg.Go(func() {
				io.Copy(p[0], p[1]) //nolint:errcheck // ends when either side closes
				p[0].Close()
				p[1].Close()
				s.mu.Lock()
				delete(s.conns, p[0])
				delete(s.conns, p[1])
				s.mu.Unlock()
			})
		}
	}
}

// track records a connection's two ends, unless the proxy is cut.
func (s *Split) track(in, out net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut {
		return false
	}
	s.conns[in], s.conns[out] = struct{}{}, struct{}{}
	return true
}
