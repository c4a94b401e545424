//go:build !linux

package main

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// rpcBound needs process_vm_readv(2) and process_vm_writev(2), which only
// Linux has (see bench_rpc_bound_linux.go).
func rpcBound(ctx context.Context, start workerLauncher, bytes, warm, iters, cores int) ([]time.Duration, error) {
	return nil, fmt.Errorf("-bound copies between processes with process_vm_readv, which %s does not have", runtime.GOOS)
}

func rpcBoundPeer(ctx context.Context, path string) error {
	return fmt.Errorf("-bound-peer: %s has no process_vm_readv", runtime.GOOS)
}
