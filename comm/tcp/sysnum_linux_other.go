//go:build linux && !amd64 && !386

package tcp

import "syscall"

const sysProcessVMReadv = syscall.SYS_PROCESS_VM_READV
