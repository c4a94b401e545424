package comm

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/tcp"
	"gorgonia.org/tensor"
)

// TestPlanHosts: ranks group by identity, hosts are numbered by their
// lowest rank, and the plan is shm for one host, tcp for one rank per host
// (or a host whose /dev/shm is too small), both otherwise.
func TestPlanHosts(t *testing.T) {
	sb := shm.Backend{}
	roomy := int64(1 << 40)
	facts := func(ids ...string) []hostFacts {
		f := make([]hostFacts, len(ids))
		for i, id := range ids {
			f[i] = hostFacts{ID: id, ShmFree: roomy}
		}
		return f
	}
	for _, tc := range []struct {
		name    string
		facts   []hostFacts
		kind    string
		members string
	}{
		{"one host", facts("a", "a", "a"), "shm", "[[0 1 2]]"},
		{"a host each", facts("a", "b", "c"), "tcp", "[[0] [1] [2]]"},
		{"unknown identities count apart", facts("", "", "a"), "tcp", "[[0] [1] [2]]"},
		{"two hosts, interleaved", facts("b", "a", "b", "a"), "hier", "[[0 2] [1 3]]"},
		{"uneven hosts", facts("a", "a", "a", "b"), "hier", "[[0 1 2] [3]]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := planHosts(tc.facts, sb)
			if p.kind != tc.kind || fmt.Sprint(p.members) != tc.members {
				t.Fatalf("plan %s %v, want %s %s (%s)", p.kind, p.members, tc.kind, tc.members, p.why)
			}
			for h, m := range p.members {
				for _, r := range m {
					if p.host[r] != h {
						t.Fatalf("rank %d is listed on host %d but numbered %d", r, h, p.host[r])
					}
				}
			}
		})
	}
	// A host whose /dev/shm cannot hold the segment: TCP for everyone, and
	// the reason names the sizes and the remedy.
	f := facts("a", "a", "b", "b")
	f[2].ShmFree = sb.SegmentBytes(2) - 1
	p := planHosts(f, sb)
	if p.kind != "tcp" || !p.noRoom || !strings.Contains(p.why, "--shm-size") {
		t.Fatalf("too small a /dev/shm: plan %s (noRoom %v): %s", p.kind, p.noRoom, p.why)
	}
	if id := localHostID(); id == "" || len(strings.Fields(id)) != 4 {
		t.Fatalf("this host's identity %q: want the boot id and three namespaces", id)
	}
}

// initHosts runs Init for n goroutine ranks over one in-memory store, rank
// r claiming host identity hostOf(r) ("" keeps the real one), with opts
// added.
func initHosts(t *testing.T, n int, hostOf func(r int) string, opts ...InitOption) []*ProcessGroup {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs, errs := initAll(n, func(r int) (*ProcessGroup, error) {
		o := []InitOption{WithStore(st), WithRank(r), WithWorldSize(n), WithoutDefault(), WithToken("hosts")}
		if hostOf != nil {
			o = append(o, WithHostID(hostOf(r)))
		}
		return Init(ctx, "env://", append(o, opts...)...)
	})
	requireAll(t, pgs, errs)
	return pgs
}

// transportKind names the backend under a group Init made.
func transportKind(pg *ProcessGroup) string {
	switch tr := unwrap(pg.world.t).(type) {
	case *shm.Transport:
		return "shm"
	case *tcp.Transport:
		return "tcp"
	case *hierTransport:
		return "hier"
	default:
		return fmt.Sprintf("%T", tr)
	}
}

// TestAutoBackendChoice: Init without WithBackend connects ranks of one
// host through shared memory, ranks of different hosts through TCP, and a
// mix through both; TANDEM_BACKEND overrides the choice and WithBackend
// overrides TANDEM_BACKEND. Each world all-reduces correctly.
func TestAutoBackendChoice(t *testing.T) {
	env := func(kv ...string) InitOption {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return withLookupEnv(lookupMap(m))
	}
	for _, tc := range []struct {
		name   string
		n      int
		hostOf func(r int) string
		opts   []InitOption
		want   string
	}{
		{"default", 3, nil, []InitOption{env()}, "shm"},
		{"same host", 3, nil, []InitOption{env(BackendEnv, "auto")}, "shm"},
		{"a host each", 3, func(r int) string { return fmt.Sprint("host", r) }, []InitOption{env(BackendEnv, "auto")}, "tcp"},
		{"two hosts of two", 4, func(r int) string { return fmt.Sprint("host", r/2) }, []InitOption{env(BackendEnv, "auto")}, "hier"},
		{"TANDEM_BACKEND=tcp", 2, nil, []InitOption{env(BackendEnv, "tcp")}, "tcp"},
		{"TANDEM_BACKEND=auto", 2, nil, []InitOption{env(BackendEnv, " auto ")}, "shm"},
		{"WithBackend beats TANDEM_BACKEND", 2, nil, []InitOption{env(BackendEnv, "tcp"), WithBackend("shm")}, "shm"},
		{"WithBackend(auto)", 2, func(r int) string { return fmt.Sprint("host", r) }, []InitOption{env(BackendEnv, "shm"), WithBackend("auto")}, "tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pgs := initHosts(t, tc.n, tc.hostOf, tc.opts...)
			for r, pg := range pgs {
				if got := transportKind(pg); got != tc.want {
					t.Fatalf("rank %d connected through %s, want %s", r, got, tc.want)
				}
			}
			checkAllReduce(t, pgs)
		})
	}
	if _, err := Lookup(AutoBackend); err != nil {
		t.Fatalf("the automatic backend is not registered: %v", err)
	}
}

// TestHierAllReduceTwoHosts all-reduces across two hosts of two ranks each
// (identities given, ranks interleaved so that the hosts are {0,2} and
// {1,3}): sizes below and above the ring threshold and lengths that do not
// divide evenly, several dtypes and reductions. Every rank must hold the
// exact expected values, the same bits on every rank; the group must take
// the hierarchical path, and a subgroup with one rank per host the flat
// one.
func TestHierAllReduceTwoHosts(t *testing.T) {
	const n = 4
	pgs := initHosts(t, n, func(r int) string { return fmt.Sprint("host", r%2) }, noEnv(), WithBackend(AutoBackend),
		WithGroupOptions(WithRingThreshold(4096), WithChunkSize(8192)))
	for r, pg := range pgs {
		if transportKind(pg) != "hier" {
			t.Fatalf("rank %d connected through %s, want both shm and tcp", r, transportKind(pg))
		}
		local, leaders, ok := (&opCtx{pg: pg}).hostViews()
		if !ok {
			t.Fatalf("rank %d: the world group does not see its hosts", r)
		}
		wantLocal := map[int]string{0: "[0 2]", 1: "[1 3]", 2: "[0 2]", 3: "[1 3]"}[r]
		if fmt.Sprint(local.pg.members) != wantLocal || local.pg.members[local.rank()] != r || (leaders != nil) != (r < 2) {
			t.Fatalf("rank %d: host view %v (rank %d), leader %v", r, local.pg.members, local.rank(), leaders != nil)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	value := func(r, i int) float64 { return float64((r+1)*(i%97+1)) / 8 } // exact in every dtype below
	for _, elems := range []int{1, 3, 1000, 20011, 100003} {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64, tensor.Int64} {
			for _, op := range []ReduceOp{Sum, Avg, Max, PremulSum(2)} {
				if dt == tensor.Int64 && op.Kind() != KindSum && op.Kind() != KindMax {
					continue
				}
				if elems > 50000 && (dt != tensor.Float32 || op.Kind() == KindMax) {
					continue // the large size once per arithmetic, to keep the test short
				}
				name := fmt.Sprintf("%d %v %v", elems, dt, op)
				outs := make([][]float64, n)
				var wg sync.WaitGroup
				for r, pg := range pgs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						in := make([]float64, elems)
						for i := range in {
							in[i] = value(r, i)
							if dt == tensor.Int64 {
								in[i] = math.Round(in[i] * 8)
							}
						}
						x := tensorOf(in, dt)
						if err := pg.AllReduce(ctx, x, op).Wait(ctx); err != nil {
							t.Errorf("%s: rank %d: %v", name, r, err)
							return
						}
						outs[r] = floatsOf(x)
					}()
				}
				wg.Wait()
				if t.Failed() {
					t.FailNow()
				}
				for i := range elems {
					var want float64
					for r := range n {
						v := value(r, i)
						if dt == tensor.Int64 {
							v = math.Round(v * 8)
						}
						switch op.Kind() {
						case KindMax:
							want = max(want, v)
						case KindPremulSum:
							want += 2 * v
						default:
							want += v
						}
					}
					if op.Kind() == KindAvg {
						want /= n
					}
					for r := range n {
						if outs[r][i] != want {
							t.Fatalf("%s: rank %d element %d is %v, want %v", name, r, i, outs[r][i], want)
						}
					}
				}
			}
		}
	}
	// A subgroup with one rank on each host runs the flat algorithms; one
	// with two ranks on a host and one on the other, the hierarchical one.
	for _, members := range [][]int{{0, 1}, {0, 1, 2}} {
		subs := make([]*ProcessGroup, n)
		var wg sync.WaitGroup
		for r, pg := range pgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				subs[r], err = pg.NewGroup(ctx, members)
				if err != nil {
					t.Errorf("rank %d: new group %v: %v", r, members, err)
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		var in []*ProcessGroup
		for _, r := range members {
			_, _, ok := (&opCtx{pg: subs[r]}).hostViews()
			if ok != (len(members) == 3) {
				t.Fatalf("subgroup %v: rank %d takes the hierarchical path: %v", members, r, ok)
			}
			in = append(in, subs[r])
		}
		checkAllReduce(t, in)
	}
}

// tensorOf returns vs as a tensor of dtype dt.
func tensorOf(vs []float64, dt tensor.Dtype) *tensor.Dense {
	switch dt {
	case tensor.Float32:
		b := make([]float32, len(vs))
		for i, v := range vs {
			b[i] = float32(v)
		}
		return tensor.New(tensor.WithShape(len(b)), tensor.WithBacking(b))
	case tensor.Int64:
		b := make([]int64, len(vs))
		for i, v := range vs {
			b[i] = int64(v)
		}
		return tensor.New(tensor.WithShape(len(b)), tensor.WithBacking(b))
	}
	return tensor.New(tensor.WithShape(len(vs)), tensor.WithBacking(append([]float64(nil), vs...)))
}

// floatsOf returns x's values as float64s.
func floatsOf(x *tensor.Dense) []float64 {
	var out []float64
	switch d := x.Data().(type) {
	case []float32:
		for _, v := range d {
			out = append(out, float64(v))
		}
	case []int64:
		for _, v := range d {
			out = append(out, float64(v))
		}
	case []float64:
		out = append(out, d...)
	}
	return out
}
