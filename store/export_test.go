package store

import "github.com/prometheus/client_golang/prometheus"

// Test access to unexported parts.
var Classify = classify

func (m *Metrics) Writes() prometheus.Counter { return m.writes }
func (m *Metrics) Reads() prometheus.Counter  { return m.reads }
