package childtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"unsafe"
)

// Victim is the body of a helper test whose process holds memory that
// another process must not be able to read (the same-host copy tests of
// comm/tcp and rpc). When env is set, the process holds 64 random bytes, 16
// token bytes and a 48-byte secret right after them, prints its pid, their
// address and both in hex ("PID ADDR TOKEN SECRET") and waits for its stdin
// to close; otherwise Victim returns at once.
func Victim(env string) {
	Main(env, "victim", func(stop context.Context, _ string) error {
		buf := make([]byte, 64)
		rand.Read(buf)
		fmt.Fprintf(os.Stdout, "%d %d %x %x\n", os.Getpid(), uintptr(unsafe.Pointer(&buf[0])), buf[:16], buf[16:])
		<-stop.Done()
		runtime.KeepAlive(buf)
		return nil
	})
}
