package store

import (
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
)

// Test access to unexported parts.
var Classify = classify

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

// Positions, for position_test.go.
var (
	EncodePosition = encodePosition
	DecodePosition = decodePosition
)

// RefusalPosition decodes what a span write's refusal carries: the
// position of stream as created at epoch (has: one is recorded), the
// count, and whether it carried the item at all.
func RefusalPosition(cond *types.ConditionalCheckFailedException, stream string, epoch int64) (p Position, has bool, count int64, returned bool, err error) {
	r, returned, err := refusalRecord(cond, PositionAttr(stream, epoch))
	return r.pos, r.has, r.count, returned, err
}

// Resolved is hotcount_store_resolved_total{outcome}.
func (m *Metrics) Resolved(outcome string) float64 {
	return testutil.ToFloat64(m.resolved.WithLabelValues(outcome))
}

// BoltPut stores v as the bolt item key, as an older version wrote it.
func BoltPut(b *Bolt, key string, v []byte) error {
	return b.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(boltBucket).Put([]byte(key), v) })
}
