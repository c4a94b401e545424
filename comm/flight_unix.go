//go:build unix

package comm

import (
	"os"
	"os/signal"
	"syscall"
)

// notifyDump relays SIGUSR1 to ch.
func notifyDump(ch chan os.Signal) bool {
	signal.Notify(ch, syscall.SIGUSR1)
	return true
}

func stopDump(ch chan os.Signal) { signal.Stop(ch) }
