// Package layers holds no code: its tests check which way the module's
// packages import each other (the pipeline never imports durability/, the
// wire packages and the client compile nothing of the sidecar), so that a
// stray import fails `make test` rather than a producer's build.
package layers
