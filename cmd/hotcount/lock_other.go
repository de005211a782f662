//go:build !unix

package main

// lockDataDir does nothing where flock does not exist: the embedded
// store's own lock still refuses a second process, later.
func lockDataDir(string) (func(), error) { return func() {}, nil }
