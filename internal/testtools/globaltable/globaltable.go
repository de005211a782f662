// Package globaltable emulates a DynamoDB global table in its default mode,
// multi-Region eventual consistency (MREC), for tests: one dynalite per
// Region, each behind an HTTP proxy that its Region's clients talk to, and
// asynchronous replication between them.
//
// What it emulates:
//
//   - Replication of whole items: after a successful write (PutItem,
//     UpdateItem, DeleteItem, each item of a BatchWriteItem or
//     TransactWriteItems), the item's image as it is now in the writing
//     Region (or its absence) is stamped with a write time and applied,
//     after a delay, to every other Region.
//   - Last writer wins: a Region that holds a newer write of the item
//     discards the incoming image. Two Regions that ADD to one item within
//     the delay therefore end with the later writer's image, and the other
//     increment is gone, silently, as in DynamoDB. While both keep writing
//     the item, each discards nearly all of the other's images: once they
//     stop, both hold the count of whichever wrote last, close to its own
//     increments alone.
//   - DescribeTable lists every Region as a replica, as DynamoDB does for a
//     global table.
//   - Cut and Heal: replication to and from a Region held (queued, in
//     order) while its clients keep being served, then delivered.
//
// What it does not: multi-Region strong consistency (MRSC); replication of
// tables, their settings or TTL deletes (create tables with CreateTable,
// in every Region at once); attribute-level merges (DynamoDB has none
// either); atomicity of a transaction in the other Regions (each item is
// replicated on its own, as in MREC); the table's key is a single string
// attribute, pk (schema.AttrPK), as in hotcount's tables.
package globaltable

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/schema"
)

// callTimeout bounds each call the emulator makes itself: a forwarded
// request, an image read, a replicated write.
const callTimeout = 30 * time.Second

// Emulator is a global table's Regions and the replication between them.
// It is safe for concurrent use.
type Emulator struct {
	t       testing.TB
	delay   time.Duration
	names   []string
	regions map[string]*region
	links   []*link
	http    *http.Client // the proxies' client to their dynalites

	unlisted   atomic.Bool  // DescribeTable lists no replicas (ListReplicas)
	clock      atomic.Int64 // the last write time handed out, Unix ns
	conflicts  atomic.Int64
	replicated atomic.Int64

	mu       sync.Mutex
	writers  map[itemKey]map[string]bool // Regions whose clients wrote each item
	cut      map[string]bool
	inflight int           // writes in a proxy, not yet queued for replication
	changed  chan struct{} // closed (and replaced) when the above or a queue shrinks

	stop    chan struct{} // closed when the emulator stops: ends the workers
	workers sync.WaitGroup
}

// region is one Region: its dynalite, the proxy in front of it, and the
// write time of each item's current image there.
type region struct {
	e      *Emulator
	name   string
	d      *testenv.Dynalite
	direct *dynamodb.Client // to dynalite itself: reads images, applies replicas
	url    string           // the proxy's
	client *dynamodb.Client // through the proxy, for the Region's clients
	srv    *http.Server
	served chan struct{} // closed when srv.Serve has returned

	mu    sync.Mutex
	items map[itemKey]*item
}

// itemKey names an item of one table.
type itemKey struct{ table, pk string }

func compareKeys(a, b itemKey) int {
	return cmp.Or(cmp.Compare(a.table, b.table), cmp.Compare(a.pk, b.pk))
}

// item is what a Region knows of one item for replication. Its lock is
// held from a local write's forwarding until its image is read and queued,
// and while an incoming image is weighed and applied: so an image always
// goes with its own write time, and a replica never lands between a local
// write and the read of its image.
type item struct {
	mu    sync.Mutex
	stamp int64 // write time of the item's current image here; 0: none yet
}

// image is an item as one write left it, on its way to the other Regions.
type image struct {
	key   itemKey
	attrs map[string]types.AttributeValue // nil: the item is gone
	stamp int64                           // the write's time
	from  string                          // the Region that wrote it
	due   time.Time                       // when it may be applied elsewhere
	lost  atomic.Bool                     // discarded in some Region: counted once
}

// link is the replication from one Region to another: its images, in the
// order they were written, and the worker that applies them.
type link struct {
	from, to *region
	queue    []*image      // with Emulator.mu; the head stays until applied
	wake     chan struct{} // one pending signal: the queue or a cut changed
}

// Start starts a global table with the given Regions (at least two, by
// name, such as "us-east-1"), each a dynalite behind a proxy on a free
// 127.0.0.1 port, and replication between them that applies each image
// no sooner than delay after its write: one at a time from one Region to
// another, in the order of their writes, so later under load (replication
// lag grows). Everything stops when the test ends. Without
// dynalite the test fails under CI=true and is skipped elsewhere (testenv).
func Start(t testing.TB, regions []string, delay time.Duration) *Emulator {
	t.Helper()
	if len(regions) < 2 {
		t.Fatalf("globaltable: a global table needs two Regions or more, got %q", regions)
	}
	e := &Emulator{
		t:       t,
		delay:   delay,
		names:   slices.Clone(regions),
		regions: map[string]*region{},
		http: &http.Client{Transport: &http.Transport{
			// Clients write concurrently: keep their connections to
			// dynalite rather than open one per request.
			MaxIdleConnsPerHost: 64,
		}},
		cut:     map[string]bool{},
		changed: make(chan struct{}),
		stop:    make(chan struct{}),
	}
	for _, name := range regions {
		if e.regions[name] != nil {
			t.Fatalf("globaltable: Region %q given twice", name)
		}
		d := testenv.StartDynalite(t)
		e.regions[name] = &region{e: e, name: name, d: d, direct: testenv.Client(d.Endpoint), items: map[itemKey]*item{}}
	}
	// Registered after the dynalites' own cleanups, so it runs before them:
	// the proxies and workers stop while their dynalites still answer.
	t.Cleanup(e.close)
	for _, name := range regions {
		r := e.regions[name]
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("globaltable: proxy for %s: %v", name, err)
		}
		r.url = "http://" + ln.Addr().String()
		r.client = testenv.Client(r.url)
		r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
		r.served = make(chan struct{})
		go func() {
			defer close(r.served)
			r.srv.Serve(ln) //nolint:errcheck // ErrServerClosed, from close
		}()
	}
	for _, from := range regions {
		for _, to := range regions {
			if from != to {
				l := &link{from: e.regions[from], to: e.regions[to], wake: make(chan struct{}, 1)}
				e.links = append(e.links, l)
				e.workers.Add(1)
				go e.run(l)
			}
		}
	}
	return e
}

// close stops the proxies, waiting for the requests they serve (each
// finishes its upstream call), then the workers; images still queued are
// dropped.
func (e *Emulator) close() {
	for _, r := range e.regions {
		if r.srv == nil {
			continue // Start failed before it
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*callTimeout)
		if err := r.srv.Shutdown(ctx); err != nil {
			r.srv.Close() //nolint:errcheck // closing anyway
		}
		cancel()
		<-r.served
	}
	close(e.stop)
	e.workers.Wait()
	e.http.CloseIdleConnections()
}

// Regions returns the Regions' names, in Start's order.
func (e *Emulator) Regions() []string { return slices.Clone(e.names) }

// Endpoint is the URL Region r's clients use (its proxy).
func (e *Emulator) Endpoint(r string) string { return e.region(r).url }

// Client is an SDK client of Region r, through its proxy, with test
// credentials and no retries (testenv.Client).
func (e *Emulator) Client(r string) *dynamodb.Client { return e.region(r).client }

func (e *Emulator) region(name string) *region {
	r := e.regions[name]
	if r == nil {
		panic(fmt.Sprintf("globaltable: no Region %q (have %q)", name, e.names))
	}
	return r
}

// CreateTable creates the table, with hotcount's schema, in every Region,
// as adding replicas to a table does.
func (e *Emulator) CreateTable(t testing.TB, name string) {
	t.Helper()
	for _, n := range e.names {
		e.regions[n].d.Table(t, name)
	}
}

// Conflicts is the number of writes that lost last writer wins: whose
// image was discarded in some Region because that Region held a newer
// write of the item, made without this one (in MREC, the silent loss of a
// concurrent write). Each write counts once, however many Regions discard
// it; the Region whose write was overwritten by the winner is the same
// conflict seen from the other side. A write counted may still live on in
// a later write of its own Region that built on it, so this counts the
// conflicts, not the increments lost: compare the items for those.
func (e *Emulator) Conflicts() int64 { return e.conflicts.Load() }

// Replicated is the number of images applied to a Region (one write
// replicated to two other Regions counts twice).
func (e *Emulator) Replicated() int64 { return e.replicated.Load() }

// Cut holds replication to and from Region r, as a Region isolated from
// the others: its images and those for it queue, in order, until Heal. Its
// proxy keeps serving its clients. An image being applied when Cut is
// called still lands.
func (e *Emulator) Cut(r string) { e.setCut(r, true) }

// Heal ends Cut: what was queued is delivered, last writer wins still
// deciding, at once for the images whose delay has passed.
func (e *Emulator) Heal(r string) { e.setCut(r, false) }

func (e *Emulator) setCut(name string, cut bool) {
	e.region(name)
	e.mu.Lock()
	e.cut[name] = cut
	e.changedLocked()
	e.mu.Unlock()
	for _, l := range e.links {
		l.poke()
	}
}

// changedLocked wakes the Settle calls waiting; with mu held.
func (e *Emulator) changedLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// Settle waits until no write is in a proxy and no image is queued or
// being applied on a link between two Regions that are not cut (a cut
// Region's links are held: they would never drain), or until ctx ends.
func (e *Emulator) Settle(ctx context.Context) error {
	for {
		e.mu.Lock()
		inflight, queued := e.inflight, 0
		for _, l := range e.links {
			if !e.heldLocked(l) {
				queued += len(l.queue)
			}
		}
		changed := e.changed
		e.mu.Unlock()
		if inflight == 0 && queued == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("globaltable: %d writes in flight, %d images to deliver: %w", inflight, queued, ctx.Err())
		}
	}
}

// Settled is Settle for a test: it fails the test unless the Regions
// settle within timeout.
func (e *Emulator) Settled(t testing.TB, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := e.Settle(ctx); err != nil {
		t.Fatal(err)
	}
}

// heldLocked says whether l is held by a cut; with mu held.
func (e *Emulator) heldLocked(l *link) bool { return e.cut[l.from.name] || e.cut[l.to.name] }

// now hands out write times: the wall clock in Unix nanoseconds, made
// strictly increasing across the emulator so that last writer wins never
// meets a tie.
func (e *Emulator) now() int64 {
	for {
		last := e.clock.Load()
		next := max(time.Now().UnixNano(), last+1)
		if e.clock.CompareAndSwap(last, next) {
			return next
		}
	}
}

// item returns the Region's record of k, creating it. Records are never
// dropped: a test writes few items.
func (r *region) item(k itemKey) *item {
	r.mu.Lock()
	defer r.mu.Unlock()
	it := r.items[k]
	if it == nil {
		it = &item{}
		r.items[k] = it
	}
	return it
}

// ServeHTTP is the proxy: it forwards every request to the Region's
// dynalite and, for a write that succeeded, queues the images of the items
// it wrote for the other Regions.
func (r *region) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	// The whole body first: dynalite must never see a request cut off
	// mid-body by a client that went away.
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	target := req.Header.Get("X-Amz-Target")
	op := target[strings.LastIndexByte(target, '.')+1:]
	keys := written(op, body)
	if len(keys) == 0 {
		resp, err := r.e.forward(req, r.d.Endpoint, body)
		if err == nil && op == "DescribeTable" && resp.Status == http.StatusOK && !r.e.unlisted.Load() {
			resp = r.e.withReplicas(resp)
		}
		reply(w, resp, err)
		return
	}
	r.e.mu.Lock()
	r.e.inflight++
	r.e.mu.Unlock()
	defer func() {
		r.e.mu.Lock()
		r.e.inflight--
		r.e.changedLocked()
		r.e.mu.Unlock()
	}()
	// Sorted, and without duplicates: two batches on the same items take
	// their locks in the same order.
	slices.SortFunc(keys, compareKeys)
	keys = slices.Compact(keys)
	items := make([]*item, len(keys))
	for i, k := range keys {
		items[i] = r.item(k)
		items[i].mu.Lock()
	}
	resp, err := r.e.forward(req, r.d.Endpoint, body)
	if err == nil && resp.Status == http.StatusOK {
		if op == "BatchWriteItem" {
			// The items DynamoDB did not write (dynalite writes all) are
			// not replicated.
			var out struct{ UnprocessedItems map[string][]writeRequest }
			if json.Unmarshal(resp.Body, &out) == nil {
				for _, k := range batchKeys(out.UnprocessedItems) {
					if i, ok := slices.BinarySearchFunc(keys, k, compareKeys); ok {
						items[i].mu.Unlock()
						keys, items = slices.Delete(keys, i, i+1), slices.Delete(items, i, i+1)
					}
				}
			}
		}
		for i, k := range keys {
			r.e.wrote(k, r.name)
			r.replicate(k, items[i])
		}
	}
	for _, it := range items {
		it.mu.Unlock()
	}
	reply(w, resp, err)
}

// replicate reads k's image from the Region's dynalite, stamps it, and
// queues it for every other Region; with its lock held.
func (r *region) replicate(k itemKey, it *item) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	out, err := r.direct.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(k.table),
		Key:            map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: k.pk}},
		ConsistentRead: aws.Bool(true),
	}, func(o *dynamodb.Options) { o.RetryMaxAttempts = 5 })
	if err != nil {
		// The write stays in this Region only: the emulator failed, not
		// the table, so the test must hear of it.
		r.e.t.Errorf("globaltable: %s: read the image of %s/%s to replicate it: %v", r.name, k.table, k.pk, err)
		return
	}
	stamp := r.e.now()
	it.stamp = stamp
	img := &image{key: k, attrs: out.Item, stamp: stamp, from: r.name, due: time.Now().Add(r.e.delay)}
	r.e.mu.Lock()
	for _, l := range r.e.links {
		if l.from == r {
			l.queue = append(l.queue, img)
		}
	}
	r.e.mu.Unlock()
	for _, l := range r.e.links {
		if l.from == r {
			l.poke()
		}
	}
}

// poke wakes l's worker, if it is not awake already.
func (l *link) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run is l's worker: it applies l's images in order, each once its delay
// has passed and while l is not held, until the emulator stops.
func (e *Emulator) run(l *link) {
	defer e.workers.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-e.stop:
			return
		default:
		}
		e.mu.Lock()
		var next *image
		if len(l.queue) > 0 && !e.heldLocked(l) {
			next = l.queue[0]
		}
		e.mu.Unlock()
		var due <-chan time.Time
		if next != nil {
			wait := time.Until(next.due)
			if wait <= 0 {
				e.apply(l.to, next)
				e.mu.Lock()
				l.queue[0] = nil
				l.queue = l.queue[1:]
				e.changedLocked()
				e.mu.Unlock()
				continue
			}
			timer.Reset(wait) // Go 1.23 timers: no stale tick to drain
			due = timer.C
		}
		select {
		case <-l.wake:
		case <-due:
		case <-e.stop:
			return
		}
	}
}

// apply applies img to Region to unless to holds a newer write of the
// item (last writer wins), which discards it.
func (e *Emulator) apply(to *region, img *image) {
	it := to.item(img.key)
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.stamp > img.stamp {
		if img.lost.CompareAndSwap(false, true) {
			e.conflicts.Add(1)
		}
		return
	}
	// Retried a while: a replica that does not land would be a loss the
	// test should not blame on last writer wins.
	var err error
	for range 50 {
		if err = to.put(img); err == nil {
			it.stamp = img.stamp
			e.replicated.Add(1)
			return
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-e.stop:
			return
		}
	}
	e.t.Errorf("globaltable: replicate %s/%s from %s to %s: %v; dropped", img.key.table, img.key.pk, img.from, to.name, err)
}

// put writes img to the Region's dynalite, directly: a replicated write
// does not pass the proxy, so it is not replicated again.
func (r *region) put(img *image) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var err error
	if img.attrs == nil {
		_, err = r.direct.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName: aws.String(img.key.table),
			Key:       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: img.key.pk}},
		})
	} else {
		_, err = r.direct.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(img.key.table), Item: img.attrs})
	}
	return err
}

// forward sends the request to upstream (ddbfault.Forward) on the
// emulator's own context, not the client's: a client that goes away must
// neither abort dynalite's request mid-body (which crashes it) nor leave a
// write applied but never replicated.
func (e *Emulator) forward(req *http.Request, upstream string, body []byte) (ddbfault.Answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return ddbfault.Forward(ctx, e.http, req, upstream, body)
}

// wrote records that region's clients wrote k.
func (e *Emulator) wrote(k itemKey, region string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.writers == nil {
		e.writers = make(map[itemKey]map[string]bool)
	}
	if e.writers[k] == nil {
		e.writers[k] = make(map[string]bool)
	}
	e.writers[k][region] = true
}

// Shared returns the items (their pk) that clients of more than one
// Region wrote: those whose writes last-writer-wins may have settled
// against one Region. Replicated writes do not count.
func (e *Emulator) Shared() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for k, regions := range e.writers {
		if len(regions) > 1 {
			out = append(out, k.pk)
		}
	}
	slices.Sort(out)
	return out
}

// ListReplicas says whether DescribeTable lists the replicas (the
// default): off, the table looks like one Region's to a sidecar that asks,
// as dynalite's do, and a sidecar without --region writes the
// single-Region layout.
func (e *Emulator) ListReplicas(on bool) { e.unlisted.Store(!on) }

// withReplicas adds the table's replicas, every Region, to a DescribeTable
// answer, as DynamoDB lists a global table's: how a sidecar finds the
// Regions to read. The body changes, so its CRC32 (which the SDK checks)
// is computed again.
func (e *Emulator) withReplicas(resp ddbfault.Answer) ddbfault.Answer {
	var out map[string]map[string]any
	if json.Unmarshal(resp.Body, &out) != nil || out["Table"] == nil {
		return resp
	}
	var replicas []map[string]string
	for _, name := range e.names {
		replicas = append(replicas, map[string]string{"RegionName": name, "ReplicaStatus": "ACTIVE"})
	}
	out["Table"]["Replicas"] = replicas
	b, err := json.Marshal(out)
	if err != nil {
		return resp
	}
	resp.Body = b
	resp.Header = resp.Header.Clone()
	resp.Header.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(b)), 10))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return resp
}

// reply sends the upstream answer to the client, or a gateway error.
func reply(w http.ResponseWriter, resp ddbfault.Answer, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.Status)
	w.Write(resp.Body) //nolint:errcheck // the client may have gone
}

// attr is the part of an attribute value the proxy reads: a string.
type attr struct{ S *string }

// writeRequest is one item of a BatchWriteItem.
type writeRequest struct {
	PutRequest    *struct{ Item map[string]attr }
	DeleteRequest *struct{ Key map[string]attr }
}

// written returns the items a write request writes; nil for any other
// request, or a body it cannot read (which dynalite refuses anyway).
func written(op string, body []byte) []itemKey {
	type one struct {
		TableName string
		Key, Item map[string]attr
	}
	switch op {
	case "PutItem", "UpdateItem", "DeleteItem":
		var b one
		if json.Unmarshal(body, &b) != nil {
			return nil
		}
		return keyOf(nil, b.TableName, b.Key, b.Item)
	case "BatchWriteItem":
		var b struct{ RequestItems map[string][]writeRequest }
		if json.Unmarshal(body, &b) != nil {
			return nil
		}
		return batchKeys(b.RequestItems)
	case "TransactWriteItems":
		var b struct {
			TransactItems []struct{ Put, Update, Delete *one } // ConditionCheck writes nothing
		}
		if json.Unmarshal(body, &b) != nil {
			return nil
		}
		var keys []itemKey
		for _, ti := range b.TransactItems {
			for _, w := range []*one{ti.Put, ti.Update, ti.Delete} {
				if w != nil {
					keys = keyOf(keys, w.TableName, w.Key, w.Item)
				}
			}
		}
		return keys
	}
	return nil
}

// batchKeys are the items of a BatchWriteItem's RequestItems (or of its
// answer's UnprocessedItems).
func batchKeys(reqs map[string][]writeRequest) []itemKey {
	var keys []itemKey
	for table, ws := range reqs {
		for _, w := range ws {
			switch {
			case w.PutRequest != nil:
				keys = keyOf(keys, table, w.PutRequest.Item)
			case w.DeleteRequest != nil:
				keys = keyOf(keys, table, w.DeleteRequest.Key)
			}
		}
	}
	return keys
}

// keyOf appends the item key found in the first of ms that has one.
func keyOf(keys []itemKey, table string, ms ...map[string]attr) []itemKey {
	for _, m := range ms {
		if pk := m[schema.AttrPK].S; pk != nil {
			return append(keys, itemKey{table: table, pk: *pk})
		}
	}
	return keys
}
