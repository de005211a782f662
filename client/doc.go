// Package client is what producers and apps import to talk to hotcount.
//
// A [Publisher] sends mentions to the sidecars over NATS: it adds up the
// mentions of each topic for a moment ([WithLinger]) and publishes one
// message per topic, {"count":n} (empty for a single mention) on
// <prefix><topic>, to the JetStream stream of mentions. Each message
// carries a Nats-Msg-Id header, so a
// publish that is retried after its acknowledgement was lost (a timeout, a
// NATS server restart) is stored once: the stream drops a repeated id seen
// within its duplicate window. With [WithCoreNATS] it publishes plain core
// NATS messages instead, for servers without JetStream: at-most-once, as a
// sidecar in core mode is. [Publisher.MentionAt] publishes mentions that
// happened at a time of their own ({"count":n,"at":<Unix ms>}), which the
// sidecars count in that time's minute and hour buckets: a backfill.
//
// A [Reader] asks a sidecar's lookup API for totals: [Reader.Total] for one
// topic, [Reader.Totals] for many in as few requests as the API allows.
//
// Both apply the sidecar's own rules before anything leaves the process
// (topics as [mention.ValidateTopic] checks them, counts in 1..max-count), so
// that a bad mention is an error at the call rather than a message the
// sidecar dead-letters.
package client
