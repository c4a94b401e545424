package autograd

import (
	"fmt"
	"strconv"
)

// ContextID names a distributed autograd context in the whole group: the id
// of the worker that began it in the top 16 bits and that worker's counter in
// the low 48, so ids are unique without coordination (as PyTorch's are).
type ContextID uint64

const idShift = 48

func makeID(worker int, seq uint64) uint64 { return uint64(worker)<<idShift | seq&(1<<idShift-1) }

// Worker returns the id of the worker that began the context (its owner).
func (id ContextID) Worker() int { return int(uint64(id) >> idShift) }

// String writes the id as worker:counter.
func (id ContextID) String() string {
	return fmt.Sprintf("%d:%d", id.Worker(), uint64(id)&(1<<idShift-1))
}

// msgString writes a message id (worker:counter, like a context id).
func msgString(id uint64) string { return ContextID(id).String() }

func formatUint(v uint64) string { return strconv.FormatUint(v, 10) }

func parseUint(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }
