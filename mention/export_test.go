package mention

// StrictPayload is ParsePayload without its fast path.
var StrictPayload = strictPayload
