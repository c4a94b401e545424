package comm

import (
	"errors"
	"testing"
)

// The recorder's own cost per operation: the three updates a collective
// makes (queued, running, ended), without the collective.
func BenchmarkFlightRecordOp(b *testing.B) {
	for _, detail := range []bool{false, true} {
		name := "default"
		if detail {
			name = "detail"
		}
		b.Run(name, func(b *testing.B) {
			r := newFlightRecorder(DefaultFlightRecorderSize, detail)
			op := collective{name: "all_reduce", desc: "all_reduce(float32,[1024],sum)"}
			b.ReportAllocs()
			for i := range b.N {
				ord := r.record(uint32(i), &op)
				r.started(ord)
				r.ended(ord, nil)
			}
		})
	}
}

// The ring wraps, and an update for a record that the ring has moved past
// changes nothing.
func TestFlightRecorderWraps(t *testing.T) {
	r := newFlightRecorder(3, false)
	op := collective{name: "barrier", desc: "barrier()"}
	var ords []uint64
	for i := range 5 {
		ords = append(ords, r.record(uint32(i), &op))
	}
	r.started(ords[0]) // overwritten by the 4th record
	r.ended(ords[0], errors.New("late"))
	r.ended(ords[4], errors.New("boom"))
	got, n := r.snapshot()
	if n != 5 || len(got) != 3 || got[0].seq != 2 || got[2].seq != 4 {
		t.Fatalf("snapshot: n=%d %+v", n, got)
	}
	if got[0].state != flightQueued || got[0].err != nil || got[2].state != flightFailed || got[2].err.Error() != "boom" {
		t.Fatalf("states: %+v", got)
	}
	var none *flightRecorder
	if ord := none.record(0, &op); ord != 0 {
		t.Fatal("a nil recorder recorded")
	}
	none.started(1)
	none.ended(1, nil)
	if got, n := none.snapshot(); got != nil || n != 0 {
		t.Fatal("a nil recorder has records")
	}
}
