// Package waits names the waits between the tries of something that
// failed: one policy per kind of wait, tuned here once, so that a reader
// of a retry loop sees which kind of wait it is, and two loops waiting
// for the same kind of thing wait alike. Each returns a fresh
// backoff.ExponentialBackOff (github.com/cenkalti/backoff/v5), owned by
// the caller.
package waits

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Reconnect is the wait for a dependency to come back or to be created:
// NATS, a stream, a key-value bucket of a cluster still electing its
// leaders. 100 ms doubling to 5 s, each wait drawn within half of it, so
// that a fleet that lost the same server does not come back in step.
func Reconnect() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     100 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         5 * time.Second,
	}
}

// Unprocessed is the wait before asking DynamoDB again for the part of a
// batch it handed back (UnprocessedKeys: under load it answers part of a
// batch rather than fail it). Each wait is drawn from [w/2, w], w
// doubling from 10 ms to 1 s: short, since the caller is a read someone
// waits for.
func Unprocessed() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     3 * 10 * time.Millisecond / 4,
		RandomizationFactor: 1.0 / 3,
		Multiplier:          2,
		MaxInterval:         3 * time.Second / 4,
	}
}

// ControlPlane is the wait between calls to DynamoDB's control plane at
// start (DescribeTable), which AWS rate-limits per account: 500 ms
// growing by half to 60 s, jittered by half (the library's defaults).
func ControlPlane() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff()
}

// Shutdown is the wait between a shutdown's flushes after one failed: 50
// ms doubling to 1 s, not jittered: the shutdown's deadline bounds it, and
// one process has no fleet to keep out of step.
func Shutdown() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval: 50 * time.Millisecond,
		Multiplier:      2,
		MaxInterval:     time.Second,
	}
}

// Watch is the wait before watching a key-value bucket again after its
// watch failed (its server gone): 1 s doubling to 10 s, jittered by half,
// so that a long outage costs a request every few seconds while the watch
// returns soon after it.
func Watch() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     time.Second,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         10 * time.Second,
	}
}
