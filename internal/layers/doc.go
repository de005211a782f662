// Package layers holds no code: its tests check which way the module's
// packages import each other (the pipeline never imports durability/; the
// wire packages, the client, the key schema and config compile nothing of
// the sidecar's stages, its SDK or its store), so that a
// stray import fails `make test` rather than a producer's build.
package layers
