package quarantine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultBucket is the key-value bucket of the durable modes' quarantine.
const DefaultBucket = "hotcount_quarantine"

// KV keeps entries in a JetStream key-value bucket, one key per entry:
// in the durable modes the quarantine lives where the journal does, on
// the NATS cluster, and every sidecar and `hotcount quarantine` see it.
type KV struct{ kv jetstream.KeyValue }

// OpenKV creates or binds the bucket, with replicas copies (0: one).
func OpenKV(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*KV, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "hotcount: writes the store refused for good, held for `hotcount quarantine replay`",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("quarantine: bucket %s: %w", bucket, err)
	}
	return &KV{kv: kv}, nil
}

// Put implements Store.
func (q *KV) Put(ctx context.Context, e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := q.kv.Put(ctx, e.Key(), b); err != nil {
		return fmt.Errorf("quarantine: put %s: %w", e.Key(), err)
	}
	return nil
}

// List implements Store.
func (q *KV) List(ctx context.Context) ([]Entry, error) {
	keys, err := q.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("quarantine: list: %w", err)
	}
	var out []Entry
	for k := range keys.Keys() {
		v, err := q.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // replayed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("quarantine: get %s: %w", k, err)
		}
		var e Entry
		if err := json.Unmarshal(v.Value(), &e); err != nil {
			return nil, fmt.Errorf("quarantine: entry %s: %w", k, err)
		}
		out = append(out, e)
	}
	sortEntries(out)
	return out, nil
}

// Get implements Store.
func (q *KV) Get(ctx context.Context, key string) (Entry, bool, error) {
	v, err := q.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("quarantine: get %s: %w", key, err)
	}
	var e Entry
	if err := json.Unmarshal(v.Value(), &e); err != nil {
		return Entry{}, false, fmt.Errorf("quarantine: entry %s: %w", key, err)
	}
	return e, true, nil
}

// Delete implements Store.
func (q *KV) Delete(ctx context.Context, e Entry) error {
	if err := q.kv.Purge(ctx, e.Key()); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("quarantine: delete %s: %w", e.Key(), err)
	}
	return nil
}

// Dir keeps entries as files in a folder, one JSON file per entry,
// written whole or not at all (a temporary file renamed and synced): core
// mode's quarantine, in its data directory, which `hotcount quarantine`
// may read while the sidecar runs.
type Dir struct{ dir string }

// OpenDir creates the folder if needed.
func OpenDir(dir string) (*Dir, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	return &Dir{dir: dir}, nil
}

const entrySuffix = ".json"

// Put implements Store.
func (q *Dir) Put(_ context.Context, e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	name := filepath.Join(q.dir, e.Key()+entrySuffix)
	tmp, err := os.CreateTemp(q.dir, ".entry-*")
	if err != nil {
		return fmt.Errorf("quarantine: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err = tmp.Write(b); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), name)
	}
	if err == nil {
		err = syncDir(q.dir)
	}
	if err != nil {
		return fmt.Errorf("quarantine: put %s: %w", e.Key(), err)
	}
	return nil
}

// List implements Store.
func (q *Dir) List(context.Context) ([]Entry, error) {
	files, err := os.ReadDir(q.dir)
	if err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	var out []Entry
	for _, f := range files {
		if f.IsDir() || !strings.HasSuffix(f.Name(), entrySuffix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(q.dir, f.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // replayed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("quarantine: %w", err)
		}
		var e Entry
		if err := json.Unmarshal(b, &e); err != nil {
			return nil, fmt.Errorf("quarantine: entry %s: %w", f.Name(), err)
		}
		out = append(out, e)
	}
	sortEntries(out)
	return out, nil
}

// Get implements Store.
func (q *Dir) Get(_ context.Context, key string) (Entry, bool, error) {
	b, err := os.ReadFile(filepath.Join(q.dir, key+entrySuffix))
	if errors.Is(err, os.ErrNotExist) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("quarantine: %w", err)
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return Entry{}, false, fmt.Errorf("quarantine: entry %s: %w", key, err)
	}
	return e, true, nil
}

// Delete implements Store.
func (q *Dir) Delete(_ context.Context, e Entry) error {
	err := os.Remove(filepath.Join(q.dir, e.Key()+entrySuffix))
	if err == nil {
		err = syncDir(q.dir)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("quarantine: delete %s: %w", e.Key(), err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close() //nolint:errcheck // read-only
	return d.Sync()
}

func sortEntries(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Writer, b.Writer), cmp.Compare(a.Seq, b.Seq))
	})
}
