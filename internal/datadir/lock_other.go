//go:build !unix

package datadir

// Lock does nothing where flock does not exist: the embedded store's own
// lock still refuses a second process, later.
func Lock(string) (func(), error) { return func() {}, nil }
