package journal

import "time"

// NewConfirmer returns (*Journal).confirmed of a journal of its own, for
// the test of the rule alone.
func NewConfirmer() func(key string, past bool, read time.Time) bool {
	j := &Journal{passed: make(map[string]time.Time), last: make(map[string][][2]int64)}
	return j.confirmed
}

// FloorConfirm is floorConfirm.
const FloorConfirm = floorConfirm
