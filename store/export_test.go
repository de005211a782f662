package store

import (
	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
)

// Test access to unexported parts.
var Classify = classify

// Expiry is r's expiresAt of a write of c.
func Expiry(r Retention, c Counter) int64 { return r.expiry(c) }

func (m *Metrics) Writes() prometheus.Counter { return m.writes }
func (m *Metrics) Reads() prometheus.Counter  { return m.reads }

// BoltItemSize is the stored size of one bolt item.
func BoltItemSize(b *Bolt, key string) (n int, err error) {
	err = b.db.View(func(tx *bolt.Tx) error {
		n = len(tx.Bucket(boltBucket).Get([]byte(key)))
		return nil
	})
	return n, err
}
