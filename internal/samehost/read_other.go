//go:build !linux

package samehost

import "errors"

// Supported reports whether this platform has process_vm_readv(2).
const Supported = false

// Read is Linux's process_vm_readv(2); elsewhere same-host copies are not
// offered and data always travels through the socket.
func Read(pid int, dst []byte, addr uint64) error { return errors.ErrUnsupported }

// Write is Linux's process_vm_writev(2); elsewhere nothing is written into
// another process.
func Write(pid int, addr uint64, src []byte) error { return errors.ErrUnsupported }

// ReadAlone is Read on one goroutine; elsewhere it is not offered either.
func ReadAlone(pid int, dst []byte, addr uint64) error { return errors.ErrUnsupported }
