// Package commtest is the conformance suite of comm: it runs every collective
// (each reduce op, dtype and world size from 1 to 5, against references
// computed here), point-to-point messages, subgroups, object collectives and
// the failure semantics (mismatched collectives, deadlines, aborts, closed
// groups) over any backend. A backend's tests call RunConformance with a
// function that builds n connected world groups:
//
//	func TestConformance(t *testing.T) {
//		commtest.RunConformance(t, func(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup {
//			pgs, err := local.NewGroups(context.Background(), n, opts...)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return pgs
//		})
//	}
//
// The suite closes the groups it gets. It is meant to run under -race.
// The point-to-point contract under the groups, the transport's, has its
// own kit, comm/transport/transporttest, which a backend passes first.
//
// The package also builds worlds for other packages' tests and benchmarks:
// Groups (goroutine ranks over any transport.Backend), InitGroups (ranks
// joining with comm.Init, as a job does), LocalRanks (a function run on
// every comm/local rank, with its own output) and BenchAllReduce (the timed
// loop of an all-reduce benchmark).
package commtest
