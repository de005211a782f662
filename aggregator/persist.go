package aggregator

// PersistBytes is what Persist would write now: the window's bytes, as
// the memory budget counts them, when Persist would keep it (core mode
// with a spill folder), else 0. The final flush stops early enough to
// leave Persist the time these bytes take.
func (a *Aggregator) PersistBytes() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.spill == nil || len(a.cur.Acks) > 0 {
		return 0
	}
	return a.bytes
}
