package dist

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stretchr/testify/require"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/testkit"
)

// backend builds the world groups of n goroutine ranks.
type backend struct {
	name   string
	groups func(t testing.TB, ctx context.Context, n int) []*comm.ProcessGroup
}

var (
	localBackend = backend{name: "local", groups: localGroups}
	tcpBackend   = backend{name: "tcp", groups: tcpGroups}
)

func localGroups(t testing.TB, ctx context.Context, n int) []*comm.ProcessGroup {
	t.Helper()
	pgs, err := local.NewGroups(ctx, n, comm.WithTimeout(time.Minute))
	if err != nil {
		t.Fatalf("local groups of %d: %v", n, err)
	}
	t.Cleanup(func() { closeAll(pgs) })
	return pgs
}

// tcpGroups connects n goroutine ranks over loopback TCP sockets through one
// in-memory store.
func tcpGroups(t testing.TB, _ context.Context, n int) []*comm.ProcessGroup {
	t.Helper()
	return commtest.Groups(t, tcp.NewBackend(tcp.WithHost("127.0.0.1")), n, comm.WithTimeout(time.Minute))
}

// closeAll closes every group concurrently (a world's ranks close together).
func closeAll(pgs []*comm.ProcessGroup) {
	var wg sync.WaitGroup
	for _, pg := range pgs {
		if pg == nil {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); pg.Close() }()
	}
	wg.Wait()
}

// onRanks runs fn for every rank on its own goroutine and returns the
// errors, one per rank. A rank whose fn fails aborts its group, so that the
// other ranks fail at once instead of waiting for their timeout.
func onRanks(pgs []*comm.ProcessGroup, fn func(r int, pg *comm.ProcessGroup) error) []error {
	return testkit.EachRank(len(pgs), func(r int) error {
		err := fn(r, pgs[r])
		if err != nil {
			pgs[r].Abort(err)
		}
		return err
	})
}

// mustRanks is onRanks failing the test on any rank's error.
func mustRanks(t testing.TB, pgs []*comm.ProcessGroup, fn func(r int, pg *comm.ProcessGroup) error) {
	t.Helper()
	for r, err := range onRanks(pgs, fn) {
		require.NoErrorf(t, err, "rank %d", r)
	}
}

// executor runs a graph once and returns the gradient values of wrt.
type executor struct {
	name string
	run  func(ctx context.Context, g *G.ExprGraph, wrt, grads G.Nodes) ([]G.Value, error)
}

var (
	// dataflow is package graph's executor with at least two workers, so
	// that independent nodes really can race. It runs the program twice
	// (the second run reuses the first one's buffers) and checks that both
	// runs give the same gradients.
	dataflow = executor{name: "graph", run: func(ctx context.Context, g *G.ExprGraph, wrt, grads G.Nodes) ([]G.Value, error) {
		prog, err := graph.Compile(g, graph.WithGrads(wrt, grads), graph.Workers(max(2, runtime.GOMAXPROCS(0))))
		if err != nil {
			return nil, err
		}
		var runs [2][]G.Value
		for k := range runs {
			if err := prog.Run(ctx); err != nil {
				return nil, fmt.Errorf("run %d: %w", k+1, err)
			}
			runs[k] = make([]G.Value, len(wrt))
			for i, w := range wrt {
				v, err := prog.Grad(w)
				if err != nil {
					return nil, err
				}
				if runs[k][i], err = G.CloneValue(v); err != nil {
					return nil, err
				}
			}
		}
		for i := range wrt {
			a, err := flatFloats(runs[0][i])
			if err != nil {
				return nil, err
			}
			b, _ := flatFloats(runs[1][i])
			if err := closeTo(b, a, 0); err != nil {
				return nil, fmt.Errorf("gradient of %s differs between two runs of one program: %w", wrt[i].Name(), err)
			}
		}
		return runs[1], nil
	}}
	// tape is gorgonia's own TapeMachine.
	tape = executor{name: "tape", run: func(_ context.Context, g *G.ExprGraph, wrt, grads G.Nodes) ([]G.Value, error) {
		m := G.NewTapeMachine(g)
		defer m.Close()
		if err := m.RunAll(); err != nil {
			return nil, err
		}
		out := make([]G.Value, len(wrt))
		for i := range wrt {
			out[i] = grads[i].Value()
		}
		return out, nil
	}}
)

// input adds an input node holding v (a scalar node for a shape-() tensor).
func input(g *G.ExprGraph, name string, v *tensor.Dense) *G.Node {
	if len(v.Shape()) == 0 {
		return G.NewScalar(g, v.Dtype(), G.WithName(name), G.WithValue(v.ScalarValue()))
	}
	return G.NewTensor(g, v.Dtype(), len(v.Shape()), G.WithShape(v.Shape().Clone()...), G.WithName(name), G.WithValue(v))
}

// objective adds sum_k <outs[k], gs[k]> to the graph: the loss whose
// gradient with respect to outs[k] is gs[k].
func objective(outs, gs G.Nodes) (*G.Node, error) {
	var cost *G.Node
	for k := range outs {
		p, err := G.HadamardProd(outs[k], gs[k])
		if err != nil {
			return nil, err
		}
		s := p
		if len(p.Shape()) > 0 {
			if s, err = G.Sum(p); err != nil {
				return nil, err
			}
		}
		if cost == nil {
			cost = s
		} else if cost, err = G.Add(cost, s); err != nil {
			return nil, err
		}
	}
	return cost, nil
}

// flatFloats returns a value's elements as float64s.
func flatFloats(v G.Value) ([]float64, error) {
	buf, _, err := flatOf(v)
	if err != nil {
		return nil, err
	}
	switch b := buf.(type) {
	case []float64:
		return b, nil
	case []float32:
		out := make([]float64, len(b))
		for i, x := range b {
			out[i] = float64(x)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%T is not a float buffer", buf)
}

// closeTo checks got against want element by element within
// tol*max(1,|want|).
func closeTo(got, want []float64, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("got %d elements, want %d", len(got), len(want))
	}
	for i := range got {
		if d := got[i] - want[i]; !(d <= tol*max(1, abs(want[i])) && -d <= tol*max(1, abs(want[i]))) {
			return fmt.Errorf("element %d: got %v, want %v (got %v, want %v)", i, got[i], want[i], short(got), short(want))
		}
	}
	return nil
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func short(v []float64) string {
	s := fmt.Sprint(v)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error mentioning %q, got nil", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}
