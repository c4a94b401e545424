package samehost

// sysProcessVMReadv is process_vm_readv(2)'s number, which the syscall
// package's frozen 386 table lacks.
const sysProcessVMReadv = 347

// sysProcessVMWritev is process_vm_writev(2)'s number.
const sysProcessVMWritev = 348
