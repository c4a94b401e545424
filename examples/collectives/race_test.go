//go:build race

package main

// raceBuild: this test binary runs under the race detector, so the programs
// the launcher tests start are built with -race too (reusing the packages
// already compiled for it, and checking the processes as well).
const raceBuild = true
