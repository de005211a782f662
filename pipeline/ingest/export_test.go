package ingest

// StrictPayload is ParsePayload without its fast path.
var StrictPayload = strictPayload
