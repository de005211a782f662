package config

import "regexp"

// durableFlags are the JetStream settings of the durable modes (jetstream
// and partitioned).
var durableFlags = []setting{
	{name: "stream", usage: "JetStream stream of mentions (jetstream mode)", bind: str(func(c *Config) *string { return &c.Stream })},
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
		if c.NATSMode == ModePartitioned {
			p.intIn("partitions", int64(c.Partitions), 1, 1024)
		}
	default:
		p.bad("nats-mode", "%q is not %s, %s or %s", c.NATSMode, ModeCore, ModeJetStream, ModePartitioned)
	}
}
