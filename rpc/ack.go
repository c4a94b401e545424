package rpc

import (
	"fmt"
	"time"

	"gorgonia.org/tensor"
)

// Acknowledgements of by-reference frames (see cma.go).

// expectAck registers interest in the read-done frame of id.
func (c *conn) expectAck(id uint64) chan struct{} {
	ch := make(chan struct{})
	c.amu.Lock()
	c.acks[id] = ch
	c.amu.Unlock()
	return ch
}

func (c *conn) ackArrived(id uint64) {
	c.acksSeen.Add(1)
	c.amu.Lock()
	ch := c.acks[id]
	delete(c.acks, id)
	c.amu.Unlock()
	if ch != nil {
		close(ch)
	}
}

func (c *conn) dropAck(id uint64) {
	c.amu.Lock()
	delete(c.acks, id)
	c.amu.Unlock()
}

// awaitAck waits until the peer has copied a by-reference frame's tensors,
// the connection failed, or give (a call's end) is closed.
func (c *conn) awaitAck(ch chan struct{}, id uint64, give <-chan struct{}, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-ch:
	case <-c.done:
		return fmt.Errorf("%w: rpc: connection to worker %s lost before it copied the tensors", ErrPeerLost, c.peer)
	case <-give:
	case <-t.C:
	}
	select {
	case <-ch:
		c.a.m.byRef.Add(1)
		return nil
	default:
	}
	c.dropAck(id)
	return fmt.Errorf("%w: rpc: worker %s did not copy the tensors within %v", ErrTimeout, c.peer, limit)
}

// byRefOK reports whether a frame with these tensors goes by reference.
func (c *conn) byRefOK(ts []*tensor.Dense) bool {
	return c.sendByRef && c.dispatching.Load() == 0 && tensorBytes(ts) >= cmaThreshold
}

// tensorBytes sums the bytes of tensors.
func tensorBytes(ts []*tensor.Dense) int {
	n := 0
	for _, t := range ts {
		n += len(t.Header.Raw)
	}
	return n
}
