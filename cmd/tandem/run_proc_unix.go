//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// workerSysProcAttr puts a worker in a process group of its own, so that a
// signal to the group reaches the worker's children too, and so that Ctrl-C
// at the terminal reaches only tandem run, which then stops the workers.
func workerSysProcAttr() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(attr)
	return attr
}

// signalGroup sends sig to the process group led by pid. A group that is
// already gone is not an error.
func signalGroup(pid int, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("cannot send %v to process group %d: not a Unix signal", sig, pid)
	}
	if err := syscall.Kill(-pid, s); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("sending %v to process group %d: %w", sig, pid, err)
	}
	return nil
}

// exitStatus turns a finished worker's state into the exit code tandem run
// reports (128+N when signal N killed it) and, for a signal, the signal.
func exitStatus(ps *os.ProcessState) (code int, sig syscall.Signal, signaled bool) {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), ws.Signal(), true
	}
	return ps.ExitCode(), 0, false
}
