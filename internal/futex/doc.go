// Package futex puts a goroutine to sleep on a 32-bit word in memory that
// several processes map, until another process changes the word and wakes
// it: Linux's futex system call, without the private flag so that
// different mappings of one file meet. Elsewhere Wait polls the word.
//
// The word must be 4-byte aligned; a waiter re-checks its own condition
// after every return, since returns may be early or spurious.
package futex
