package ddp_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/ddp"
)

// normNet is plainNet with its gradient nodes built with the graph and the
// squared norm of w1's gradient computed from that node, so that w1's
// gradient has a reader in the graph and w2's has none.
func normNet(batch int, seed uint64) *gnet {
	net := plainNet(batch, seed)
	grads, err := G.Grad(net.loss, net.params...)
	if err != nil {
		panic(err)
	}
	net.grads = grads
	net.extra = map[string]*G.Node{"norm": G.Must(G.Sum(G.Must(G.Square(grads[0]))))}
	return net
}

// TestGraphGradsWithReaders: a gradient node that another node of the graph
// reads is copied into its bucket, never reduced where the reader reads it,
// while the gradient without readers is computed in its bucket; training
// equals one process on the whole batch, and the reader sees this rank's
// own gradient.
func TestGraphGradsWithReaders(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			_, _, st := runParity(t, world, parityCase{name: "gradient norm in the graph", build: normNet,
				drive: func(ctx context.Context, n *ddp.GraphDDP, net *gnet, f ddp.ByName) (float64, error) {
					loss, err := n.Step(ctx, f)
					if err != nil {
						return 0, err
					}
					local := n.GradNode(net.params[0]).Value().(*tensor.Dense).Float64s()
					sum := 0.0
					for _, v := range local {
						sum += v * v
					}
					got := net.extra["norm"].Value().Data().(float64)
					if math.Abs(got-sum) > 1e-12*sum {
						return 0, fmt.Errorf("the norm node read %v; this rank's gradient of w1 has squared norm %v", got, sum)
					}
					avg, err := net.params[0].Grad()
					if err != nil {
						return 0, err
					}
					if &avg.(*tensor.Dense).Float64s()[0] == &local[0] {
						return 0, fmt.Errorf("w1's gradient node holds the averaged gradient; it has a reader and must keep this rank's")
					}
					return loss, nil
				}})
			if st.GradsInBucket != 5 || st.GradsCopied != 5 {
				t.Errorf("gradients computed in the buckets %d, copied in %d; want 5 (w2's) and 5 (w1's, read by the norm)", st.GradsInBucket, st.GradsCopied)
			}
		})
	}
}
