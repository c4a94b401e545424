package ddp_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/models"
)

// backends are the ways tests build a world of goroutine ranks.
var backends = []struct {
	name string
	make func(t *testing.T, n int) []*comm.ProcessGroup
}{
	{"local", localWorld},
	{"tcp", tcpWorld},
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// localWorld returns n goroutine ranks over the in-process backend.
func localWorld(t *testing.T, n int) []*comm.ProcessGroup {
	t.Helper()
	pgs, err := local.NewGroups(context.Background(), n, comm.WithTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(pgs) })
	return pgs
}

// tcpWorld returns n goroutine ranks, each with its own TCP transport over
// loopback sockets.
func tcpWorld(t *testing.T, n int) []*comm.ProcessGroup {
	t.Helper()
	return commtest.Groups(t, tcp.NewBackend(tcp.WithHost("127.0.0.1")), n, comm.WithTimeout(30*time.Second))
}

func closeAll(pgs []*comm.ProcessGroup) {
	var wg sync.WaitGroup
	for _, pg := range pgs {
		if pg != nil {
			wg.Add(1)
			go func() { defer wg.Done(); pg.Close() }()
		}
	}
	wg.Wait()
}

// newMLP builds an MLP whose weights depend on seed.
func newMLP(t testing.TB, sizes []int, seed uint64, opts ...models.Option) *models.Sequential {
	m, err := models.NewMLP(sizes, append([]models.Option{models.WithRand(rand.New(rand.NewPCG(seed, 99))), models.WithDtype(tensor.Float64)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// batch returns a deterministic batch of n rows of in features and labels
// in [0, classes).
func batch(seed uint64, n, in, classes int) (*tensor.Dense, *tensor.Dense) {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := make([]float64, n*in)
	for i := range x {
		x[i] = rng.NormFloat64()
	}
	y := make([]int64, n)
	for i := range y {
		y[i] = int64(rng.IntN(classes))
	}
	return tensor.New(tensor.WithShape(n, in), tensor.WithBacking(x)), tensor.New(tensor.WithShape(n), tensor.WithBacking(y))
}

// rows returns rows [a, b) of a 2-D float64 tensor, or of a 1-D int64 one, as
// a new tensor.
func rows(t *tensor.Dense, a, b int) *tensor.Dense {
	sh := t.Shape()
	if len(sh) == 1 {
		return tensor.New(tensor.WithShape(b-a), tensor.WithBacking(append([]int64(nil), t.Int64s()[a:b]...)))
	}
	w := sh[1]
	return tensor.New(tensor.WithShape(b-a, w), tensor.WithBacking(append([]float64(nil), t.Float64s()[a*w:b*w]...)))
}

// relClose reports whether a and b agree to tol relative to the larger.
func relClose(a, b, tol float64) bool {
	return a == b || math.Abs(a-b) <= tol*math.Max(math.Abs(a), math.Abs(b))
}

func maxRelDiff(a, b []float64) float64 {
	m := 0.0
	for i := range a {
		d := math.Abs(a[i]-b[i]) / math.Max(1e-300, math.Max(math.Abs(a[i]), math.Abs(b[i])))
		if a[i] == b[i] {
			d = 0
		}
		m = math.Max(m, d)
	}
	return m
}
