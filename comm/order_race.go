//go:build race

package comm

// note records an issue on the group. The write is deliberately
// unsynchronised: under the race detector, two goroutines that issue
// collectives on one group with no happens-before edge between them are
// reported here.
func (o *issueOrder) note() { o.n++ }
