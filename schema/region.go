package schema

import (
	"fmt"
	"slices"
	"strings"
)

// Regions. A DynamoDB global table in its default mode (multi-Region
// eventual consistency) replicates whole items and settles two Regions'
// concurrent writes to one item by last writer wins: the other Region's
// increment is gone, with no error anywhere, and a condition is checked
// against the local replica only, so the marks cannot stop it. Write
// sharding extends to Regions instead: a sidecar with a Region writes only
// items its Region owns, whose shard id names the Region (InRegion), and
// no item has writers in two Regions. A total or a bucket is read, from
// the local replica, as the sum over every Region's shards and the
// single-Region shards a table had before it went global (read by every
// Region, written by none).
//
//	TREND#<topic>#<shard>              the single-Region layout
//	TREND#<topic>#<region>.<shard>     the Region's shards
//	TREND#<topic>#<region>.meta        the Region's shard counts
//	MINUTE#<topic>#<minute>#<region>.<shard>, HOUR#... likewise
//	FLEET#<region>.history             the Region's history start

// Regions is where a store writes and what it reads. The zero Regions is
// the single-Region layout.
type Regions struct {
	// Own is the Region this process writes in: only its own items. ""
	// writes the single-Region layout.
	Own string
	// All is every Region whose items reads gather (Own is read whether
	// listed or not).
	All []string
}

// Active says whether r is multi-Region (Own set).
func (r Regions) Active() bool { return r.Own != "" }

// Reads is what a read gathers: the single-Region layout ("") first, then
// each Region once, Own included. Outside multi-Region, only "".
func (r Regions) Reads() []string {
	if !r.Active() {
		return []string{""}
	}
	out := []string{"", r.Own}
	for _, reg := range r.All {
		if !slices.Contains(out, reg) {
			out = append(out, reg)
		}
	}
	return out
}

// regionSep separates a Region from the shard id it prefixes.
const regionSep = '.'

// InRegion returns a single-Region key (ShardKey, BucketKey, MetaKey,
// HistoryKey) as region's item: its last '#'-separated field, the shard
// id, prefixed by the Region and a '.'. An empty region returns key.
func InRegion(key, region string) string {
	if region == "" {
		return key
	}
	i := strings.LastIndexByte(key, '#')
	return key[:i+1] + region + string(regionSep) + key[i+1:]
}

// SplitRegion is InRegion's inverse: the single-Region key and the
// Region ("" for a key of the single-Region layout).
func SplitRegion(key string) (base, region string) {
	i := strings.LastIndexByte(key, '#')
	id := key[i+1:]
	j := strings.IndexByte(id, regionSep)
	if j < 0 {
		return key, ""
	}
	return key[:i+1] + id[j+1:], id[:j]
}

// ValidateRegion checks a Region's name before it goes into keys: AWS's
// shape, lower-case letters, digits and '-' (us-east-1), which keeps '.'
// and '#' out.
func ValidateRegion(region string) error {
	if region == "" || len(region) > 32 {
		return fmt.Errorf("region %q: want 1 to 32 characters", region)
	}
	for _, r := range region {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return fmt.Errorf("region %q: only a-z, 0-9 and '-' (as in us-east-1)", region)
		}
	}
	return nil
}

// RegionPart is what one Region's shards of a topic hold, as read from
// the local replica: Count its mentions that have replicated here, and
// UpdatedAt (Unix ms) its latest write among them, so that now minus
// UpdatedAt bounds how far behind that Region's part may be.
type RegionPart struct {
	// Region is "" for the single-Region shards of the table's past.
	Region    string `json:"region"`
	Count     int64  `json:"count"`
	Shards    int    `json:"shards"`
	UpdatedAt int64  `json:"updatedAt"`
}

// ByRegion adds up shards per Region, in the order they come (Gather's:
// by Region, then shard). Nil when every shard is the single-Region
// layout's.
func ByRegion(shards []Shard) []RegionPart {
	var parts []RegionPart
	multi := false
	for _, s := range shards {
		multi = multi || s.Region != ""
		if len(parts) == 0 || parts[len(parts)-1].Region != s.Region {
			parts = append(parts, RegionPart{Region: s.Region})
		}
		p := &parts[len(parts)-1]
		p.Count, _ = SatAdd(p.Count, s.Count)
		p.Shards++
		p.UpdatedAt = max(p.UpdatedAt, s.UpdatedAt)
	}
	if !multi {
		return nil
	}
	return parts
}
