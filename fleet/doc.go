// Package fleet is what a sidecar knows of the other sidecars of its fleet,
// over core NATS:
//
//   - Members: who is alive, announced every interval, and which of the
//     stream's partitions each one owns (partitioned mode);
//   - Shares: the totals the others gathered, taken into this sidecar's
//     lookup cache instead of gathering them again (--share-totals).
//
// Their constructors start nothing. Each has a Run that subscribes,
// handles what arrives on its own goroutine (nothing runs in nats.go's
// callbacks) and, when its context ends, unsubscribes and returns.
package fleet
