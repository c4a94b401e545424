//go:build unix

package checkpoint

import (
	"errors"
	"syscall"
)

// processGone reports whether no process with this pid exists (signal 0
// probes without signalling; EPERM means it exists under another user).
func processGone(pid int) bool {
	if pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
