package comm

import "sync/atomic"

// defaultGroup is the process's default group: the only global state of
// comm besides the backend registry.
var defaultGroup atomic.Pointer[ProcessGroup]

// Default returns the process's default group, or nil when there is none.
// Init and InitFromEnv install the first group they return (unless given
// WithoutDefault); SetDefault replaces it. Layers that take an optional group
// (ops, ddp) fall back to it.
func Default() *ProcessGroup { return defaultGroup.Load() }

// SetDefault makes pg the default group and returns the previous one; nil
// clears it. Closing a group does not clear it: call SetDefault(nil) when the
// default group is closed and the process goes on.
func SetDefault(pg *ProcessGroup) (previous *ProcessGroup) { return defaultGroup.Swap(pg) }
