package schema

// A topic's shard counts live in its metadata item, pk = TREND#<topic>#meta
// (not a shard: never summed). A topic without one has one shard, shard 0:
// quiet topics pay one row. Writers put increments in shards 0..Shards-1;
// readers sum shards 0..ReadShards-1, the most the topic ever had, so
// lowering Shards never hides a count.
const (
	// MetaSuffix ends a metadata item's partition key, in place of a shard id.
	MetaSuffix = "meta"
	// AttrShards is the metadata's current shard count, for writers.
	AttrShards = "shards"
	// AttrReadShards is the most shards the topic ever had, for readers.
	AttrReadShards = "readShards"
)

// MetaKey returns the partition key of topic's metadata item.
func MetaKey(topic string) string { return KeyPrefix + topic + "#" + MetaSuffix }

// Meta is a topic's shard counts. The zero Meta is a topic without a
// metadata item: one shard.
type Meta struct {
	Shards     int `json:"shards"`
	ReadShards int `json:"readShards"`
	// Elsewhere is, with Regions (region.go), the most shards the topic
	// ever had in the single-Region layout or another Region: readers
	// read that many there. Not stored; 0 in one Region.
	Elsewhere int `json:"-"`
}

// Exists says whether the metadata item exists.
func (m Meta) Exists() bool { return m.Shards > 0 }

// Write is the number of shards writers spread increments over.
func (m Meta) Write() int { return max(m.Shards, 1) }

// Read is the number of shards readers sum.
func (m Meta) Read() int { return max(m.ReadShards, m.Shards, m.Elsewhere, 1) }

// With returns m changed to n shards for writers; the read set never
// shrinks.
func (m Meta) With(n int) Meta {
	return Meta{Shards: n, ReadShards: max(m.ReadShards, m.Shards, 1, n), Elsewhere: m.Elsewhere}
}
