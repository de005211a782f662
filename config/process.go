package config

import (
	"net"
	"strings"
	"time"
)

// processFlags are the process's own: its listeners, its memory budgets,
// its shutdown and its logs, and the file the other settings may come from.
var processFlags = []setting{
	{name: "http", was: EnvPrefix + "HTTP_ADDR", usage: "listen address of the lookup API", bind: str(func(c *Config) *string { return &c.HTTPAddr })},
	{name: "http-token-file", usage: "file holding the bearer token the lookup API requires (Authorization: Bearer <token>); empty: none, allowed only on a loopback --http or with --http-public", bind: str(func(c *Config) *string { return &c.HTTPTokenFile })},
	{name: "memory-limit", usage: "the process's memory budget (GOMEMLIMIT is set to 90% of it): bytes with an optional Ki, Mi or Gi suffix; empty: the container's cgroup limit, if any; none: no limit", bind: str(func(c *Config) *string { return &c.MemoryLimit })},
	{name: "buffer-memory", usage: "memory the buffered window may take (topic names plus 64 B each) before it is flushed early, spilled (core mode) or fetching pauses (JetStream mode): bytes with an optional Ki, Mi or Gi suffix; empty: an eighth of the memory limit, or 256Mi with none; none: no bound", bind: str(func(c *Config) *string { return &c.BufferMemory })},
	{name: "spill-max-bytes", usage: "core mode: disk the window may spill to, in --data-dir/spill, while the store does not take writes; past it mentions are shed and counted; 0: no spill", bind: str(func(c *Config) *string { return &c.SpillMaxBytes })},
	{name: "http-public", usage: "serve the lookup API beyond this machine without a token (anyone who can reach --http reads every count), and, with no --http-token-file, the data of the console on --admin too", bind: boolean(func(c *Config) *bool { return &c.HTTPPublic })},
	{name: "admin", was: EnvPrefix + "ADMIN_ADDR", usage: "listen address of /healthz, /readyz and /metrics", bind: str(func(c *Config) *string { return &c.AdminAddr })},
	{name: "health-flush-age", usage: "/healthz fails when no flush has written anything of its work for longer than this (0: 5 flush intervals)", bind: dur(func(c *Config) *time.Duration { return &c.HealthFlushAge })},
	{name: "shutdown-timeout", usage: "whole shutdown budget: NATS drain, final flush, HTTP shutdown", bind: dur(func(c *Config) *time.Duration { return &c.ShutdownTimeout })},
	{name: "log-format", usage: "log encoding: json or console", bind: str(func(c *Config) *string { return &c.LogFormat })},
	{name: "log-level", usage: "lowest level logged: debug, info, warn, error", bind: str(func(c *Config) *string { return &c.LogLevel })},
	{name: "console-race", usage: "offer the race on the admin listener's /console: direct writes against coalesced ones, on a throwaway in-memory store with an emulated per-key ceiling (never the real store); on in hotcount dev", bind: boolean(func(c *Config) *bool { return &c.ConsoleRace })},
	{name: "pprof", usage: "serve Go's profiles (net/http/pprof) at /debug/pprof on --admin: to this machine only (kubectl port-forward), or with --http-token-file to any address that sends the token; off by default", bind: boolean(func(c *Config) *bool { return &c.Pprof })},
	{name: "config", usage: "YAML file of settings, keyed by flag name", bind: str(func(c *Config) *string { return &c.File })},
}

// checkListeners checks the lookup API's and the admin listener's
// addresses, and that the lookup API is not left open by accident.
func (c *Config) checkListeners(p *problems) {
	p.addr("http", c.HTTPAddr)
	if c.HTTPTokenFile == "" && !c.HTTPPublic && !loopback(c.HTTPAddr) {
		p.bad("http", "%s listens beyond this machine and --http-token-file is not set: set a token file, or --http-public to serve every count to anyone who can reach it", c.HTTPAddr)
	}
	p.addr("admin", c.AdminAddr)
	if overlap(c.HTTPAddr, c.AdminAddr) {
		p.bad("admin", "%s and --http %s would bind the same port: give them different ports", c.AdminAddr, c.HTTPAddr)
	}
	p.durIn("health-flush-age", c.HealthFlushAge, 0, 24*time.Hour)
}

// checkShutdown checks that the shutdown budget leaves room for the final
// flush after the NATS drain.
func (c *Config) checkShutdown(p *problems) {
	p.durIn("shutdown-timeout", c.ShutdownTimeout, time.Second, 10*time.Minute)
	if c.ShutdownTimeout-c.ShutdownReserve() <= c.DrainTimeout {
		p.bad("shutdown-timeout", "%s must be longer than drain-timeout %s plus the reserve kept after the final flush (%s), to leave time for the final flush", c.ShutdownTimeout, c.DrainTimeout, c.ShutdownReserve())
	}
}

// checkMemory checks the memory budgets and the spill folder's bound.
func (c *Config) checkMemory(p *problems) {
	if _, err := ParseBytes(c.MemoryLimit); err != nil && c.MemoryLimit != "none" {
		p.bad("memory-limit", "%v", err)
	}
	if n, err := ParseBytes(c.BufferMemory); err != nil && c.BufferMemory != "none" {
		p.bad("buffer-memory", "%v", err)
	} else if c.BufferMemory != "" && c.BufferMemory != "none" && n < 1<<20 {
		p.bad("buffer-memory", "%s is less than 1Mi", c.BufferMemory)
	}
	if _, err := ParseBytes(c.SpillMaxBytes); err != nil {
		p.bad("spill-max-bytes", "%v", err)
	}
}

// checkLogging checks the log encoding and level.
func (c *Config) checkLogging(p *problems) {
	if c.LogFormat != "json" && c.LogFormat != "console" {
		p.bad("log-format", "%q is not json or console", c.LogFormat)
	}
	// What zapcore.ParseLevel takes, without compiling zap here.
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "", "warn", "warning", "error", "dpanic", "panic", "fatal":
	default:
		p.bad("log-level", "%q is not debug, info, warn or error", c.LogLevel)
	}
}

// loopbackHost says whether host names this machine's loopback interface
// (localhost resolves to 127.0.0.1 and ::1 alike, so it may share a port
// with either).
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopback says whether a listen address binds only this machine's
// loopback interface (an empty host binds every interface).
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host != "" && loopbackHost(host)
}

// overlap says whether two listen addresses would bind the same port: the
// same port on the same host, on two loopback names, or on any host when
// one binds every interface (an empty host, 0.0.0.0 or ::). Port 0 picks a
// free port, so it never conflicts.
func overlap(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb || pa == "0" {
		return false
	}
	every := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || every(ha) || every(hb) || (loopbackHost(ha) && loopbackHost(hb))
}
