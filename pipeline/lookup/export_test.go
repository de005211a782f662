package lookup

// Serving says whether s's Run has its refresh workers up: a test that
// counts refreshes at once waits for it.
func Serving(s *Service) bool {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.pool.serving
}

// Queued is how many background tasks wait for one of Run's workers.
func Queued(s *Service) int {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return len(s.pool.queue)
}
