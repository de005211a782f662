package store

import (
	"errors"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// errClosed is the answer to a write sent after Close.
var errClosed = errors.New("store: closed")

// maxGroup bounds the writes of one transaction, so that a write waits
// behind at most this many others' work.
const maxGroup = 4096

// boltCall is one write waiting for its group's transaction.
type boltCall struct {
	fn  func(*bolt.Tx) error
	err chan error
}

// groupCommitter runs writes in as few transactions, so as few fsyncs, as
// the load allows: while one transaction commits, every write sent meanwhile
// waits, and the next transaction takes them all. bbolt's own Batch closes a
// batch after a fixed delay even while the previous one still holds the
// file: under a long tail of new topics (each write touches another page,
// so a commit takes many milliseconds) that queued batch after small batch,
// each with its own fsync, and the store fell behind 20,000 new topics a
// second. Its goroutine is the committer's, started by newGroupCommitter
// and ended by close.
type groupCommitter struct {
	db       *bolt.DB
	calls    chan boltCall
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func newGroupCommitter(db *bolt.DB) *groupCommitter {
	g := &groupCommitter{db: db, calls: make(chan boltCall, maxGroup), stop: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g
}

// do runs fn in a write transaction shared with other writes and returns
// its error. fn may run more than once (when another write of its group
// fails, the rest run again without it), so it must be safe to repeat. A
// refusal that changes nothing (a condition not met) is better reported
// through fn's own variables than as its error: an error costs the rest of
// the group another run.
func (g *groupCommitter) do(fn func(*bolt.Tx) error) error {
	c := boltCall{fn: fn, err: make(chan error, 1)}
	select {
	case g.calls <- c:
	case <-g.stop:
		return errClosed
	}
	select {
	case err := <-c.err:
		return err
	case <-g.done:
		// The committer has ended: it answered this write before it did,
		// or never took it from the queue (sent as it stopped).
		select {
		case err := <-c.err:
			return err
		default:
			return errClosed
		}
	}
}

func (g *groupCommitter) run() {
	defer close(g.done)
	for {
		var group []boltCall
		select {
		case c := <-g.calls:
			group = append(group, c)
		case <-g.stop:
			return
		}
	more:
		for len(group) < maxGroup {
			select {
			case c := <-g.calls:
				group = append(group, c)
			default:
				break more
			}
		}
		g.commit(group)
	}
}

// commit runs group in one transaction. A write whose function fails is
// answered with its error alone, and the rest run again without it (what
// bbolt's Batch does too), so that one bad write never fails the others.
func (g *groupCommitter) commit(group []boltCall) {
	for len(group) > 0 {
		failed := -1
		err := g.db.Update(func(tx *bolt.Tx) error {
			for i, c := range group {
				if err := c.fn(tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			for _, c := range group {
				c.err <- err // nil, or the commit's own failure for all
			}
			return
		}
		group[failed].err <- err
		group = append(group[:failed:failed], group[failed+1:]...)
	}
}

// close stops the committer after the transaction it is running. Writes
// sent later are refused with errClosed. It may be called more than once.
func (g *groupCommitter) close() {
	g.stopOnce.Do(func() { close(g.stop) })
	<-g.done
}
