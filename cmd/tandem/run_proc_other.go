//go:build !unix

package main

import (
	"fmt"
	"os"
	"syscall"
)

// workerSysProcAttr sets nothing: process groups are a Unix feature, so on
// this system a worker's own children are not stopped with it.
func workerSysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup ends the worker pid. This system cannot deliver SIGINT or
// SIGTERM to another process, so every signal ends it at once.
func signalGroup(pid int, sig os.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil // already gone
	}
	if err := p.Kill(); err != nil && err != os.ErrProcessDone {
		return fmt.Errorf("ending process %d (for %v): %w", pid, sig, err)
	}
	return nil
}

// exitStatus returns a finished worker's exit code; no signals here.
func exitStatus(ps *os.ProcessState) (code int, sig syscall.Signal, signaled bool) {
	return ps.ExitCode(), 0, false
}
