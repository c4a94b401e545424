//go:build linux

package shm

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// processGone reports whether the process with the given id has ended:
// no process has the id, or it is a zombie that its parent has not reaped
// yet (a rank killed under a launcher or test harness stays one until its
// parent waits for it, and kill(pid, 0) still finds it).
func processGone(pid int) bool {
	if syscall.Kill(pid, 0) == syscall.ESRCH {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return os.IsNotExist(err)
	}
	// "pid (comm) S ...": the state follows the last ')', since comm may
	// hold anything.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	state := b[i+2]
	return state == 'Z' || state == 'X'
}
