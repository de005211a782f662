package schema

// Counters. A topic has an all-time count and, with time buckets on, a
// count per minute and per hour (bucket.go). Between the flusher's plan
// and the store a counter travels as a Counter; the ingest's buffer (the
// aggregator), its spill files and the quarantine's entries keep it under a
// compact name instead (AppendName, ParseName), read once where a stage
// takes them in.
//
// With time buckets on, the ingest counts each mention in a counter of
// kind Fresh, its topic's minute: one counter per topic per minute, no
// more memory than the topic's own. The flusher splits each Fresh counter
// into the topic's total and its minute and hour buckets (Split); what it
// cannot write goes back as those, never Fresh again, so no mention
// reaches a bucket or a total twice.

// Kind is what a counter counts.
type Kind uint8

// The kinds.
const (
	// Total is a topic's all-time count (the zero Kind).
	Total Kind = iota
	// Fresh is the ingest's count of a topic's mentions in one minute,
	// bound for its total, its minute and its hour (Split); it is never
	// written as such.
	Fresh
	// MinuteBucket is a topic's count in one minute (Granularity Minute).
	MinuteBucket
	// HourBucket is a topic's count in one hour (Granularity Hour).
	HourBucket
)

// Counter is one counter of a topic: its total, or one of its time
// buckets. It is comparable, and a map key.
type Counter struct {
	Topic string
	Kind  Kind
	// Index is the bucket's index (Granularity.Index), for Fresh its
	// minute's; 0 for a total.
	Index int64
}

// TotalOf is topic's all-time counter.
func TotalOf(topic string) Counter { return Counter{Topic: topic} }

// BucketOf is topic's bucket i of g.
func BucketOf(topic string, g Granularity, i int64) Counter {
	if g == Hour {
		return Counter{Topic: topic, Kind: HourBucket, Index: i}
	}
	return Counter{Topic: topic, Kind: MinuteBucket, Index: i}
}

// IsBucket says whether c is a time bucket's counter (Fresh included)
// rather than a topic's total.
func (c Counter) IsBucket() bool { return c.Kind != Total }

// CountsMentions says whether c's delta is mentions: a topic's total, or
// a Fresh counter (which becomes one). A bucket's repeats mentions counted
// in a total.
func (c Counter) CountsMentions() bool { return c.Kind == Total || c.Kind == Fresh }

// Granularity is the length of c's bucket, for a MinuteBucket or an
// HourBucket (ok false for a total or a Fresh counter).
func (c Counter) Granularity() (g Granularity, ok bool) {
	switch c.Kind {
	case MinuteBucket:
		return Minute, true
	case HourBucket:
		return Hour, true
	}
	return 0, false
}

// bucket is the granularity of c's item: a Fresh counter is keyed as its
// minute.
func (c Counter) bucket() Granularity {
	if c.Kind == HourBucket {
		return Hour
	}
	return Minute
}

// Split returns the counters a Fresh counter's delta goes to: its topic's
// total, and the minute and hour buckets that hold its minute (all zero
// when c is not Fresh).
func (c Counter) Split() (total, minute, hour Counter) {
	if c.Kind != Fresh {
		return Counter{}, Counter{}, Counter{}
	}
	return TotalOf(c.Topic), BucketOf(c.Topic, Minute, c.Index), BucketOf(c.Topic, Hour, Hour.Index(Minute.Start(c.Index)))
}

// Key is the partition key of c's item on shard: ShardKey for a total,
// BucketKey for a bucket (a Fresh counter's is its minute's, though it is
// never written as such).
func (c Counter) Key(shard int) string {
	if c.Kind == Total {
		return ShardKey(c.Topic, shard)
	}
	return BucketKey(c.Topic, c.bucket(), c.Index, shard)
}

// Counter names: a total is named by its topic; a bucket by counterMark,
// a control character ValidateTopic keeps out of every topic (so the two
// never meet), its kind's byte, its index in indexLen printable digits
// (names go into JSON quarantine entries, which take UTF-8 only), then
// the topic. Quarantine entries and spill files hold these names: the encoding
// must not change, or what an earlier version left is misread.
const (
	counterMark = '\x01'
	// indexLen is the width of a counter name's bucket index, in
	// indexDigits: 64^5 minutes reach the year 4011.
	indexLen    = 5
	indexDigits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"
	maxIndex    = 1<<30 - 1
)

// The kinds' bytes in a name.
const (
	freshByte  = 'M'
	minuteByte = 'm'
	hourByte   = 'h'
)

// digitOf is each byte's value as an index digit, -1 for a byte that is
// none.
var digitOf = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for v, d := range []byte(indexDigits) {
		t[d] = int8(v)
	}
	return t
}()

// AppendName appends c's name to b, for callers that name a counter per
// message without allocating. A bucket's index is kept within 0 and
// 64^5-1.
func (c Counter) AppendName(b []byte) []byte {
	var kind byte
	switch c.Kind {
	case Total:
		return append(b, c.Topic...)
	case Fresh:
		kind = freshByte
	case MinuteBucket:
		kind = minuteByte
	default:
		kind = hourByte
	}
	i := c.Named().Index
	b = append(b, counterMark, kind)
	for k := indexLen - 1; k >= 0; k-- {
		b = append(b, indexDigits[(i>>(6*k))&63])
	}
	return append(b, c.Topic...)
}

// Named is c as its name keeps it: an index outside what a name holds
// (below 0, or past 2^30-1, an "at" from another era) is clamped, as
// AppendName clamps it.
func (c Counter) Named() Counter {
	if c.Kind != Total {
		c.Index = min(max(c.Index, 0), maxIndex)
	}
	return c
}

// Name is c's name (AppendName's); a total's is its topic, not a copy.
func (c Counter) Name() string {
	if c.Kind == Total {
		return c.Topic
	}
	return string(c.AppendName(make([]byte, 0, 2+indexLen+len(c.Topic))))
}

// ParseName reads a counter's name (AppendName's). Its Topic is part of
// name, not a copy. ok is false for a name that starts with the bucket
// mark and is no bucket's (a damaged spill file or quarantine entry): it is
// read, as before names had a type, as the total of a topic spelt like
// the whole name, so that its delta is written rather than lost.
func ParseName(name string) (c Counter, ok bool) {
	if len(name) == 0 || name[0] != counterMark {
		return Counter{Topic: name}, true
	}
	if len(name) < 2+indexLen {
		return Counter{Topic: name}, false
	}
	switch name[1] {
	case freshByte:
		c.Kind = Fresh
	case minuteByte:
		c.Kind = MinuteBucket
	case hourByte:
		c.Kind = HourBucket
	default:
		return Counter{Topic: name}, false
	}
	for k := range indexLen {
		d := digitOf[name[2+k]]
		if d < 0 {
			return Counter{Topic: name}, false
		}
		c.Index = c.Index<<6 | int64(d)
	}
	c.Topic = name[2+indexLen:]
	return c, true
}
