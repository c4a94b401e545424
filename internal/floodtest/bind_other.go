//go:build !linux

package floodtest

import "syscall"

func bindNoPort(network, address string, c syscall.RawConn) error { return nil }
