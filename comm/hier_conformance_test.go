package comm_test

import (
	"fmt"
	"testing"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
)

// TestHostsConformance runs the backend conformance suite over worlds that
// Init connects automatically, the ranks (goroutines) playing two hosts:
// even ranks on one, odd ranks on the other. A world of one runs over
// shared memory, of two over TCP (a rank per host), of three and four over
// both, with the hierarchical all-reduce.
func TestHostsConformance(t *testing.T) {
	commtest.RunConformance(t, func(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup {
		return commtest.InitGroups(t, n, func(r int) []comm.InitOption {
			return []comm.InitOption{comm.WithBackend(comm.AutoBackend), comm.WithHostID(fmt.Sprint("host", r%2)),
				comm.WithToken("conformance"), comm.WithGroupOptions(opts...)}
		})
	})
}
