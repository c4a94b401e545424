//go:build !linux

package rpc

import "unsafe"

// hugePageHint does nothing where transparent huge pages are unknown.
func hugePageHint(p unsafe.Pointer, size uintptr) {}
