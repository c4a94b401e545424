//go:build !race

package comm

// note does nothing without the race detector; see issueOrder.
func (o *issueOrder) note() {}
