package durable

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// delivery is what a reader needs of a JetStream message's reply
// subject: its consumer and stream sequences, its publication time and
// how many messages the consumer had left after it.
type delivery struct {
	consumerSeq, streamSeq uint64
	published              time.Time
	pending                uint64
}

// errNotAcked is a reply subject that is not a JetStream delivery's.
var errNotAcked = errors.New("durable: not a JetStream delivery's reply subject")

// The reply subject's forms, as nats.go's parser (internal/parser, which
// Msg.Metadata uses) reads them:
//
//	v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
//	v2: $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>...]
//
// v1 has 9 tokens; v2 at least 11 (the 12th, a random token, may go, and
// more may come). v2 is v1 with two tokens after $JS.ACK.
const (
	ackPrefix   = "$JS.ACK."
	v1Tokens    = 9
	v2MinTokens = 11
	// v1Before are the tokens before <sseq> in v1: $JS, ACK, <stream>,
	// <consumer>, <delivered>; v2 has its domain and account hash more.
	v1Before, v2Before = 5, 7
)

// parseDelivery reads reply, a JetStream message's reply subject, in
// either form. It does what msg.Metadata() does without its allocation
// (a MsgMetadata per message, a share of the readers' GC) and without the
// names it also returns, which the reader does not need.
func parseDelivery(reply string) (delivery, error) {
	if !strings.HasPrefix(reply, ackPrefix) {
		return delivery{}, fmt.Errorf("%w: %q", errNotAcked, reply)
	}
	tokens := strings.Count(reply, ".") + 1
	var skip int
	switch {
	case tokens == v1Tokens:
		skip = v1Before
	case tokens >= v2MinTokens:
		skip = v2Before
	default:
		return delivery{}, fmt.Errorf("%w: %d tokens in %q", errNotAcked, tokens, reply)
	}
	rest := reply
	for range skip {
		_, rest, _ = strings.Cut(rest, ".")
	}
	var n [4]uint64 // <sseq>.<cseq>.<ts>.<pending>
	for i := range n {
		var tok string
		tok, rest, _ = strings.Cut(rest, ".")
		v, ok := decimal(tok)
		if !ok {
			return delivery{}, fmt.Errorf("%w: %q: %q is not a number", errNotAcked, reply, tok)
		}
		n[i] = v
	}
	return delivery{streamSeq: n[0], consumerSeq: n[1], published: time.Unix(0, int64(n[2])), pending: n[3]}, nil
}

// decimal reads s, digits only, as a uint64; ok is false for anything
// else, or a number that overflows. strconv.ParseUint does the same at
// several times the cost, for bases and forms a reply subject never has.
func decimal(s string) (n uint64, ok bool) {
	if s == "" {
		return 0, false
	}
	for i := range len(s) {
		d := uint64(s[i] - '0')
		if d > 9 || n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}
