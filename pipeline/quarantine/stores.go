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
)

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
