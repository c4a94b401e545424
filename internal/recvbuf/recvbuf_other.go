//go:build !linux

package recvbuf

import "unsafe"

// hugePageHint does nothing where transparent huge pages are unknown.
func hugePageHint(p unsafe.Pointer, size uintptr) {}

// populate does nothing where it is not known how to map pages at once.
func populate(p unsafe.Pointer, size uintptr) {}
