//go:build !linux

package tcp

import "errors"

// processVMRead is Linux's process_vm_readv(2); elsewhere single-copy
// transfers are not offered and messages always travel through the socket.
func processVMRead(pid int, local []byte, remote uint64) error { return errors.ErrUnsupported }
