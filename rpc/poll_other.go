//go:build !unix

package rpc

import (
	"net"
	"sync/atomic"
)

// pollReader is the plain connection where the runtime offers no file
// descriptor to poll: reads park at once.
type pollReader struct {
	net.Conn
	spin atomic.Int64 // unused here
}

func newPollReader(net.Conn) *pollReader { return nil }
