// Package cputime reads the CPU time this process has used, for benchmarks
// that report what a step costs when other processes compete for the cores
// (wall time then includes waiting for one).
package cputime
