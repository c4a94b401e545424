package comm

// Issuing collectives from several goroutines.
//
// A group matches collectives across ranks by their order of issue: the
// n-th collective issued on a group on one rank runs with the n-th issued
// on every other rank. Each collective's fingerprint (operation, dtype,
// shape, root, reduce op) is compared across ranks, so a mix-up between
// different collectives is an error on every rank. But when two goroutines
// of one rank issue collectives on the same group without ordering
// themselves, and the two collectives have the same fingerprint (two
// all-reduces of equal shape, say), ranks can pair them up differently and
// nothing can tell: each rank gets a sum of the wrong tensors, silently.
//
// So: issue the collectives of one group from one goroutine, or order the
// goroutines that issue them (a mutex held across the issue and a fixed
// order of taking it, a channel hand-off, or one group per goroutine with
// NewGroup or Split). Async collectives are fine: issuing is ordered, the
// running overlaps.
//
// Builds with the race detector check this: every issue writes a field of
// the group that only an ordered hand-off between the issuing goroutines
// makes safe, so two goroutines issuing on one group with nothing ordering
// them are reported as a data race on issueOrder.n, with both goroutines'
// stacks. Tests of code that issues from several goroutines should run
// with -race. Builds without the race detector do nothing here.

// issueOrder is written, without synchronisation, by every goroutine that
// issues a collective on a group (see above); it is checked only under the
// race detector.
type issueOrder struct {
	//lint:ignore U1000 written and read by order_race.go, under the race detector only
	n uint64
}
