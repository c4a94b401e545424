// Package vec runs the element-wise float32 loops of a training step (a
// bias added to each row, with or without a ReLU after it, a bias
// gradient summed over rows, ReLU's backward mask) eight elements an
// instruction in AVX where the processor has it, and in plain Go
// elsewhere. Every kernel rounds exactly as its plain loop does (one add
// or one multiply per element, no fused operations) and treats NaNs and
// signed zeros as Go's arithmetic and its max do, so the two give the same
// bits, but for the payloads of NaNs.
package vec
