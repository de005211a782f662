// Package bench holds the benchmarks that compare hotcount with the raw
// limits of its parts measured in the same run: a bare NATS subscriber on a
// separate server process, a bare aws-sdk-go-v2 client against dynalite, and
// NATS's own JetStream counters. `make bench` runs them with the others and
// writes docs/BENCHMARKS.md (bench/report).
package bench
