package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tandemml/tandem/comm"
)

func TestDescBytes(t *testing.T) {
	for _, tc := range []struct {
		desc string
		n    int64
		ok   bool
	}{
		{"all_reduce(float32,[4],sum)", 16, true},
		{"all_reduce(float64,[],sum)", 8, true}, // a scalar
		{"all_reduce_coalesced(float64,[2];[3,4],sum)", 112, true},
		{"broadcast(bfloat16,[10,10],src=0)", 200, true},
		{"all_reduce(int8,[0],sum)", 0, true},
		{"barrier()", 0, false},
		{"all_gather_object_payload(96 bytes)", 96, true},
		{"broadcast_object_list_payload(root=1,1024 bytes)", 1024, true},
		{"broadcast_object_list_header(root=1)", 0, false},
		{"all_reduce(complex64,[4],sum)", 0, false},
		{"all_reduce(float32,[4,x],sum)", 0, false},
		{"all_reduce(float32,[4", 0, false},
		{"all_gather(float32,[1000,1000],...#0123456789abcdef", 0, false},
	} {
		n, ok := descBytes(tc.desc)
		if n != tc.n || ok != tc.ok {
			t.Errorf("descBytes(%q) = %d, %v; want %d, %v", tc.desc, n, ok, tc.n, tc.ok)
		}
	}
}

func TestKindLabel(t *testing.T) {
	for in, want := range map[string]string{
		"all_reduce": "all_reduce",
		"broadcast_object_list_payload(root=0,96 bytes)": "broadcast_object_list_payload",
		"all_gather_object_header()":                     "all_gather_object_header",
	} {
		if got := kindLabel(in); got != want {
			t.Errorf("kindLabel(%q) = %q, want %q", in, got, want)
		}
	}
}

// Each operation is counted once it ends, however many scrapes see it,
// also when one issued before it still runs (a receive waiting for its
// message while collectives go on).
func TestGroupCountsEachOpOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	op := func(seq uint32, state string) comm.FlightOp {
		o := comm.FlightOp{Ord: uint64(seq) + 1, Seq: seq, Kind: "all_reduce", Desc: "all_reduce(float32,[4],sum)", State: state, Enqueued: t0, Started: t0}
		if state == "done" || state == "failed" {
			o.Ended = t0.Add(time.Millisecond)
		}
		return o
	}
	rec := comm.FlightRecord{Groups: []comm.FlightGroup{{Name: "default_pg", ID: 0, Recorded: 3,
		Ops: []comm.FlightOp{op(0, "done"), op(1, "running"), op(2, "done")}}}}
	c := newGroupCollector(func() comm.FlightRecord { return rec })
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	read := func(m prometheus.Metric) float64 {
		var out dto.Metric
		if err := m.Write(&out); err != nil {
			t.Fatal(err)
		}
		return out.GetCounter().GetValue()
	}
	count := func(state string) float64 { return read(c.ops.WithLabelValues("default_pg", "all_reduce", state)) }
	for range 2 {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
		if got := count("done"); got != 2 {
			t.Fatalf("with op 1 running: %v done, want 2", got)
		}
	}
	rec.Groups[0].Ops[1] = op(1, "failed")
	rec.Groups[0].Ops = append(rec.Groups[0].Ops, op(3, "queued"))
	rec.Groups[0].Recorded = 4
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	// The ring moves on: ops 0 to 2 leave it, op 3 ends and op 4 comes.
	rec.Groups[0].Ops = []comm.FlightOp{op(3, "done"), op(4, "done")}
	rec.Groups[0].Recorded = 5
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if d := count("done"); d != 4 {
		t.Fatalf("after the ring moved on: %v done, want 4", d)
	}
	// Nothing is counted twice in later scrapes.
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if d, f := count("done"), count("failed"); d != 4 || f != 1 {
		t.Fatalf("later: %v done and %v failed, want 4 and 1", d, f)
	}
	if got := read(c.bytes.WithLabelValues("default_pg", "all_reduce")); got != 64 {
		t.Errorf("bytes %v, want 64 (failed operations carry none)", got)
	}
	for _, f := range fams {
		if f.GetName() == "tandem_collective_ops_recorded_total" {
			if got := f.GetMetric()[0].GetCounter().GetValue(); got != 5 {
				t.Errorf("tandem_collective_ops_recorded_total = %v, want 5", got)
			}
			return
		}
	}
	t.Error("no tandem_collective_ops_recorded_total gathered")
}
