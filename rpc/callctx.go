package rpc

import (
	"context"
	"sync"
	"time"
)

// callCtx is the context a handler runs in: it carries the call's deadline,
// caller, metadata and agent, and ends at the deadline, when the caller
// cancels the call, or when the agent shuts down at once. Its Done channel
// and timer are made only when someone asks for Done, so handlers that never
// look cost no timer.
type callCtx struct {
	parent   context.Context // the agent's base context
	deadline time.Time       // zero: none
	caller   WorkerInfo
	meta     Metadata
	agent    *Agent

	mu         sync.Mutex
	done       chan struct{}
	closed     bool
	err        error
	timer      *time.Timer
	stopParent func() bool
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if c.err != nil {
		c.closeLocked()
		return c.done
	}
	if !c.deadline.IsZero() {
		d := time.Until(c.deadline)
		if d <= 0 {
			c.finishLocked(context.DeadlineExceeded)
			return c.done
		}
		c.timer = time.AfterFunc(d, func() { c.cancel(context.DeadlineExceeded) })
	}
	c.stopParent = context.AfterFunc(c.parent, func() { c.cancel(context.Canceled) })
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		if !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
			c.finishLocked(context.DeadlineExceeded)
		} else if c.parent.Err() != nil {
			c.finishLocked(context.Canceled)
		}
	}
	return c.err
}

func (c *callCtx) Value(key any) any {
	switch key {
	case callerKey:
		return c.caller
	case metaKey:
		if c.meta == nil {
			return nil
		}
		return c.meta
	case agentKey:
		return c.agent
	}
	return c.parent.Value(key)
}

func (c *callCtx) String() string { return "rpc.callContext" }

// cancel ends the context with err (if it has not ended) and releases its
// timer.
func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.finishLocked(err)
}

func (c *callCtx) finishLocked(err error) {
	if c.err == nil {
		c.err = err
	}
	c.closeLocked()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.stopParent != nil {
		c.stopParent()
		c.stopParent = nil
	}
}

func (c *callCtx) closeLocked() {
	if c.done != nil && !c.closed {
		close(c.done)
		c.closed = true
	}
}
