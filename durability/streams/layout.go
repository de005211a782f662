// Package streams is where partitioned mode's mentions live in JetStream:
// one stream per partition, fed by an account mapping in the NATS server
// that sends each `mentions.<topic>` to its topic's partition.
//
// Why streams and not one stream with a filter per partition: nats-server
// delivers to a filtered consumer that is behind at about half the rate of
// an unfiltered one, and one stream has one leader, so a fleet could count
// no faster than one server takes and delivers one stream. A partition
// stream needs no filter, and the partition streams' leaders spread over
// the cluster's servers (Spread).
//
// Why the server routes, not the producers: producers keep publishing
// plain `mentions.<topic>` with any NATS client (`nats pub` included), and
// the server's mapping is the one place that decides a topic's partition,
// the same for every producer. Of computes the same partition here, for the
// probe that checks the mapping is in force.
package streams

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// Layout names partitioned mode's streams and subjects.
type Layout struct {
	// Stream is --stream: the partition streams are named after it.
	Stream string
	// Subject is --subject, what producers publish to ("mentions.>").
	Subject string
	// Partitions is --partitions.
	Partitions int
}

// Name is partition p's stream: "MENTIONS-3".
func (l Layout) Name(p int) string { return l.Stream + "-" + strconv.Itoa(p) }

// Names are the partition streams' names, partition p's at p.
func (l Layout) Names() []string {
	out := make([]string, l.Partitions)
	for p := range out {
		out[p] = l.Name(p)
	}
	return out
}

// Stored is the subject partition p's stream takes, the mapping's
// destination for the topics of p: "3.mentions.>". A message of it is
// the producer's subject with the partition number put first.
func (l Layout) Stored(p int) string { return strconv.Itoa(p) + "." + l.Subject }

// Mapping is the account mapping that routes producers' subjects to the
// partition streams: from Subject to "{{partition(n)}}.<Subject>", the
// partition a hash of the whole subject (so of the topic).
func (l Layout) Mapping() (from, to string) {
	return l.Subject, fmt.Sprintf("{{partition(%d)}}.%s", l.Partitions, l.Subject)
}

// Of is the partition the server's mapping sends subject to: nats-server's
// partition function, FNV-1a (32 bits) of the whole subject modulo the
// partitions (server/subject_transform.go, getHashPartition).
func (l Layout) Of(subject string) int {
	h := fnv.New32a()
	h.Write([]byte(subject)) //nolint:errcheck // a hash.Hash never fails
	return int(h.Sum32() % uint32(l.Partitions))
}

// RulesSubject is the subject of stream's rules messages (package
// rules): outside every mention subject, taken by the stream besides its
// mentions.
func RulesSubject(stream string) string { return RulesPrefix + stream }

// RulesPrefix starts every rules subject.
const RulesPrefix = "hotcount.rules."

// Unstored is the subject a producer published, from the subject a
// partition stream stored it under (Stored): the partition number removed.
func Unstored(subject string) string {
	_, s, _ := strings.Cut(subject, ".")
	return s
}

// A Position names a message across the partition streams: the partition
// in the top bits, the message's stream sequence below. Outside
// partitioned mode (one stream) a position is the stream sequence itself.
// The audit keeps a counter's last mention as one, to tell which stream's
// checkpoint it must be under.
type Position = int64

// seqBits is the stream sequence's share of a Position: 2^48 messages a
// stream, 2^15 partitions (--partitions allows 1,024).
const seqBits = 48

// At is the position of stream sequence seq in partition p.
func At(p int, seq uint64) Position { return int64(p)<<seqBits | int64(seq&(1<<seqBits-1)) }

// Split is At's inverse.
func Split(pos Position) (p int, seq uint64) {
	return int(pos >> seqBits), uint64(pos) & (1<<seqBits - 1)
}
