package config

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Validate checks every setting and reports all problems at once, each
// naming the setting and what it allows.
func (c *Config) Validate() error {
	var p problems
	prefix := c.checkNATS(&p)
	c.checkStore(&p)
	c.checkFlush(&p)
	c.checkCache(&p)
	c.checkWindows(&p, prefix)
	c.checkListeners(&p)
	c.checkShutdown(&p)
	c.checkMemory(&p)
	c.checkLogging(&p)
	if len(p) > 0 {
		return fmt.Errorf("config: %w", errors.Join(p...))
	}
	return nil
}

// problems collects Validate's complaints, so that one run reports them all
// rather than making the user fix one setting at a time.
type problems []error

// bad records a complaint about setting name.
func (p *problems) bad(name, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: "+format, append([]any{name}, args...)...))
}

// durIn complains when d is outside lo..hi.
func (p *problems) durIn(name string, d, lo, hi time.Duration) {
	if d < lo || d > hi {
		p.bad(name, "%s is outside %s..%s", d, lo, hi)
	}
}

// intIn complains when v is outside lo..hi.
func (p *problems) intIn(name string, v, lo, hi int64) {
	if v < lo || v > hi {
		p.bad(name, "%d is outside %d..%d", v, lo, hi)
	}
}

// addr complains when v is not a listen address.
func (p *problems) addr(name, v string) {
	if _, _, err := net.SplitHostPort(v); err != nil {
		p.bad(name, "%q is not host:port: %v", v, err)
	}
}
