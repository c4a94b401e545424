package main

import "syscall"

// setParentDeathSignal makes the kernel kill a worker if tandem run itself
// dies without the chance to stop it (SIGKILL, a crash).
func setParentDeathSignal(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }
