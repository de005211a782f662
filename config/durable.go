package config

import (
	"regexp"
	"time"
)

// durableFlags are the JetStream settings of the durable modes (jetstream
// and partitioned).
var durableFlags = []setting{
	{name: "stream", usage: "JetStream stream of mentions (jetstream mode)", bind: str(func(c *Config) *string { return &c.Stream })},
	{name: "consumer", usage: "the durable consumer the previous release's journal engine read the stream with: hotcount stream adopt checkpoints at its acknowledgement floor, and a sidecar refuses a stream it read past the checkpoint", bind: str(func(c *Config) *string { return &c.Consumer })},
	{name: "ack-wait", usage: "not read any more (the durable modes send no acknowledgements); accepted so that an old configuration starts", bind: dur(func(c *Config) *time.Duration { return &c.AckWait })},
	{name: "max-ack-pending", usage: "not read any more (the durable modes send no acknowledgements); accepted so that an old configuration starts", bind: integer(func(c *Config) *int { return &c.MaxAckPending })},
	{name: "durable-engine", usage: "how the durable modes count exactly once: position, the one engine (each item records the last stream sequence it includes, writes apply only past it, partitions are read without acknowledgements from a checkpoint; docs/SEMANTICS.md); journal, the previous release's engine, is refused with what to run", bind: str(func(c *Config) *string { return &c.DurableEngine })},
	{name: "partitions", usage: "partitioned mode: partition streams, one per partition (hotcount stream create sets them up, the NATS server's mapping routes into them); at least the fleet's size", bind: integer(func(c *Config) *int { return &c.Partitions })},
}

// jsName is the rule for JetStream stream and consumer names.
var jsName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,255}$`)

// checkNATSMode checks the mode and, in the durable modes, the JetStream
// settings they use.
func (c *Config) checkNATSMode(p *problems) {
	switch c.NATSMode {
	case ModeCore:
	case ModeJetStream, ModePartitioned:
		if !jsName.MatchString(c.Stream) {
			p.bad("stream", "%q is not a JetStream name (letters, digits, - and _)", c.Stream)
		}
		if !jsName.MatchString(c.Consumer) {
			p.bad("consumer", "%q is not a JetStream name (letters, digits, - and _)", c.Consumer)
		}
		switch c.DurableEngine {
		case EnginePosition:
		case "journal":
			p.bad("durable-engine", "the journal engine is gone: run the sidecars with position (the default), after `hotcount stream adopt` on streams the journal read (docs/SEMANTICS.md, \"Upgrading from the journal\")")
		default:
			p.bad("durable-engine", "%q is not %s", c.DurableEngine, EnginePosition)
		}
		if c.NATSMode == ModePartitioned {
			p.intIn("partitions", int64(c.Partitions), 1, 1024)
		}
	default:
		p.bad("nats-mode", "%q is not %s, %s or %s", c.NATSMode, ModeCore, ModeJetStream, ModePartitioned)
	}
}
