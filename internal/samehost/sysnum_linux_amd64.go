package samehost

// sysProcessVMReadv is process_vm_readv(2)'s number, which the syscall
// package's frozen amd64 table lacks.
const sysProcessVMReadv = 310

// sysProcessVMWritev is process_vm_writev(2)'s number.
const sysProcessVMWritev = 311
