// Package cpufeat tells which vector instructions the processor and the
// operating system offer, for the packages that carry assembly kernels
// (optim's updates, blas's matrix product). Builds with the purego tag, and
// other architectures, report none.
package cpufeat
