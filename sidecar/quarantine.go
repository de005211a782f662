package sidecar

import (
	"path/filepath"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/pipeline/quarantine"
)

// OpenQuarantine opens core mode's quarantine, the folder quarantine in
// --data-dir, this sidecar's own. The durable modes have none of their
// own: the engine holds a refused counter in its stream's checkpoint
// record (durable.HeldIn lists them).
func OpenQuarantine(cfg config.Config) (*quarantine.Dir, error) {
	return quarantine.OpenDir(filepath.Join(cfg.DataDir, "quarantine"))
}
