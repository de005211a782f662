package ingest

// StrictCount is Count without its fast path.
var StrictCount = strictCount
