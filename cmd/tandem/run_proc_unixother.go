//go:build unix && !linux

package main

import "syscall"

// setParentDeathSignal does nothing here: only Linux can tie a child's life
// to its parent's, so workers outlive a tandem run that is killed with SIGKILL.
func setParentDeathSignal(*syscall.SysProcAttr) {}
