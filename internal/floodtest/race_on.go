//go:build race

package floodtest

// Race reports whether the race detector is on. Its runtime keeps memory of
// its own that the Go runtime cannot give back, so RSS bounds after a flood
// need more room under it.
const Race = true
