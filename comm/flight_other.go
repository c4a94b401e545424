//go:build !unix

package comm

import "os"

// notifyDump does nothing: the system has no SIGUSR1.
func notifyDump(chan os.Signal) bool { return false }

func stopDump(chan os.Signal) {}
