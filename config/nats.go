package config

import (
	"strings"
	"time"

	"github.com/hotcount/hotcount/mention"
)

// natsFlags are the connection to NATS and its credentials.
var natsFlags = []setting{
	{name: "nats-url", usage: "NATS server URL(s), comma-separated", bind: str(func(c *Config) *string { return &c.NATSURL })},
	{name: "nats-mode", usage: "core (at most once: a crash loses the buffer), jetstream (the stream read in order from a checkpoint by one sidecar of the fleet at a time; exactly once) or partitioned (jetstream with the stream partitioned by topic and each partition consumed by one sidecar, so the fleet writes a hot topic once per flush)", bind: str(func(c *Config) *string { return &c.NATSMode })},
	{name: "nats-creds", usage: "NATS credentials file (JWT and NKey seed)", bind: str(func(c *Config) *string { return &c.NATSCreds })},
	{name: "nats-nkey", usage: "NATS NKey seed file", bind: str(func(c *Config) *string { return &c.NATSNKey })},
	{name: "nats-token", usage: "NATS authentication token (prefer the environment variable; never printed)", bind: str(func(c *Config) *string { return &c.NATSToken }), secret: true},
	{name: "nats-tls-ca", usage: "CA certificate file that signed the NATS server's certificate", bind: str(func(c *Config) *string { return &c.NATSTLSCA })},
	{name: "nats-tls-cert", usage: "client certificate file for NATS mutual TLS (with --nats-tls-key)", bind: str(func(c *Config) *string { return &c.NATSTLSCert })},
	{name: "nats-tls-key", usage: "client key file for NATS mutual TLS (with --nats-tls-cert)", bind: str(func(c *Config) *string { return &c.NATSTLSKey })},
}

// ingestFlags are what the sidecar subscribes to, and the subjects it
// publishes rejects and shared totals on.
var ingestFlags = []setting{
	{name: "subject", usage: "subject of mentions, <prefix>.>: the sidecar subscribes to it, load publishes to <prefix>.<topic>; the topic is what follows the prefix", bind: str(func(c *Config) *string { return &c.Subject })},
	{name: "queue-group", usage: "NATS queue group shared by the sidecars", bind: str(func(c *Config) *string { return &c.QueueGroup })},
	{name: "share-totals", usage: "share gathered totals with the other sidecars over NATS, so that the fleet gathers a hot topic about once per TTL instead of once per sidecar: auto (on in jetstream mode), true or false", bind: str(func(c *Config) *string { return &c.ShareTotals })},
	{name: "share-subject", usage: "subject the sidecars share gathered totals on", bind: str(func(c *Config) *string { return &c.ShareSubject })},
	{name: "dead-letter-subject", usage: "subject that rejected messages are republished to (empty: none)", bind: str(func(c *Config) *string { return &c.DeadLetterSubject })},
	{name: "drain-timeout", usage: "at shutdown, how long the NATS drain may take", bind: dur(func(c *Config) *time.Duration { return &c.DrainTimeout })},
}

// checkNATS checks the connection to NATS and what the sidecar reads from
// it. It returns the subscription's subject prefix ("" when the subject is
// bad), which the subjects the sidecar publishes on must stay out of.
func (c *Config) checkNATS(p *problems) (prefix string) {
	if c.NATSURL == "" {
		p.bad("nats-url", "must not be empty")
	}
	c.checkNATSMode(p)
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		p.bad("nats-tls-cert", "and nats-tls-key go together")
	}
	if c.NATSCreds != "" && c.NATSNKey != "" {
		p.bad("nats-creds", "and nats-nkey are two ways to authenticate: choose one")
	}
	prefix = c.checkSubjects(p)
	p.durIn("drain-timeout", c.DrainTimeout, 0, time.Minute)
	return prefix
}

// checkSubjects checks the subscription, the queue group and the subjects
// the sidecar publishes rejects and shared totals on, and returns the
// subscription's prefix.
func (c *Config) checkSubjects(p *problems) string {
	prefix, err := mention.Prefix(c.Subject)
	if err != nil {
		p.bad("subject", "%v", err)
	}
	if c.QueueGroup == "" {
		p.bad("queue-group", "must not be empty (every sidecar would get every mention)")
	}
	if c.DeadLetterSubject != "" && prefix != "" && strings.HasPrefix(c.DeadLetterSubject, prefix) {
		p.bad("dead-letter-subject", "%q is under the subscription %q: rejects would come back as mentions", c.DeadLetterSubject, c.Subject)
	}
	switch c.ShareTotals {
	case "auto", "true", "false":
	default:
		p.bad("share-totals", "%q is not auto, true or false", c.ShareTotals)
	}
	if c.SharesTotals() {
		if c.ShareSubject == "" || strings.ContainsAny(c.ShareSubject, "*> \t") {
			p.bad("share-subject", "%q is not a plain NATS subject", c.ShareSubject)
		} else if prefix != "" && strings.HasPrefix(c.ShareSubject, prefix) {
			p.bad("share-subject", "%q is under the subscription %q: shared totals would come back as mentions", c.ShareSubject, c.Subject)
		}
	}
	return prefix
}
