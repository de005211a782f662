package aggregator

// PersistBytes is the most Persist may have to write once the next flush
// is done: the window's bytes, as the memory budget counts them, and,
// while the spill folder holds segments, what Drain may take back of them
// (up to the budget), since a flush that cannot write those puts them
// back on disk. 0 when Persist would keep nothing (no spill folder). The
// final flush stops early enough to leave Persist the time these bytes
// take.
func (a *Aggregator) PersistBytes() int64 {
	if a.spill == nil {
		return 0
	}
	a.mu.Lock()
	n := a.bytes
	a.mu.Unlock()
	if spilled, _ := a.spill.Stats(); spilled > 0 {
		n += min(spilled, a.maxBytes)
	}
	return n
}
