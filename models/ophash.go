package models

import (
	"fmt"
	"hash/fnv"
)

// hashOf hashes an op by its String form, which every op in this package
// makes unique to its configuration (stateful ops include an instance id,
// so gorgonia never merges two of them).
func hashOf(op fmt.Stringer) uint32 {
	h := fnv.New32a()
	fmt.Fprint(h, op.String())
	return h.Sum32()
}
