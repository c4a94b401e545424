//go:build !linux

package shm

import (
	"context"
	"fmt"
	"runtime"

	"github.com/tandemml/tandem/comm/transport"
)

// Backend builds shared-memory transports; it needs Linux's futexes, so on
// this system Connect fails.
type Backend struct{}

// Connect fails: the shm backend runs on Linux only.
func (Backend) Connect(context.Context, transport.Config) (transport.Transport, error) {
	return nil, fmt.Errorf("shm: the shared-memory backend runs on Linux only, not %s; use the tcp backend: %w", runtime.GOOS, transport.ErrInvalidArgument)
}

// SegmentBytes returns 0: there is no segment on this system.
func (Backend) SegmentBytes(world int) int64 { return 0 }

// FreeBytes fails: the shm backend runs on Linux only.
func (Backend) FreeBytes() (int64, error) {
	return 0, fmt.Errorf("shm: the shared-memory backend runs on Linux only, not %s: %w", runtime.GOOS, transport.ErrInvalidArgument)
}
