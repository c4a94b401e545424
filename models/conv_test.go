package models

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// directConv computes a convolution by its definition.
func directConv(x []float64, n, cin, h, w int, l *Conv2d) ([]float64, int, int) {
	wt := l.Weight.Value.Float64s()
	kh, kw := l.Kernel[0], l.Kernel[1]
	oh := (h+2*l.Padding[0]-l.Dilation[0]*(kh-1)-1)/l.Stride[0] + 1
	ow := (w+2*l.Padding[1]-l.Dilation[1]*(kw-1)-1)/l.Stride[1] + 1
	out := make([]float64, n*l.Out*oh*ow)
	for b := 0; b < n; b++ {
		for o := 0; o < l.Out; o++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					s := 0.0
					if l.Bias != nil {
						s = l.Bias.Value.Float64s()[o]
					}
					for c := 0; c < cin; c++ {
						for u := 0; u < kh; u++ {
							for v := 0; v < kw; v++ {
								r := i*l.Stride[0] - l.Padding[0] + u*l.Dilation[0]
								q := j*l.Stride[1] - l.Padding[1] + v*l.Dilation[1]
								if r < 0 || r >= h || q < 0 || q >= w {
									continue
								}
								s += x[((b*cin+c)*h+r)*w+q] * wt[((o*cin+c)*kh+u)*kw+v]
							}
						}
					}
					out[((b*l.Out+o)*oh+i)*ow+j] = s
				}
			}
		}
	}
	return out, oh, ow
}

func TestConv2dForwardAndGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	cases := []struct {
		name string
		opts []Option
		h, w int
	}{
		{"plain", nil, 5, 6},
		{"stride2 pad1", []Option{WithStride(2, 2), WithPadding(1, 1)}, 6, 5},
		{"rect dilated no bias", []Option{WithKernel(2, 3), WithDilation(2, 1), WithPadding(1, 0), WithBias(false)}, 6, 7},
		{"pointwise", []Option{WithKernel(1, 1)}, 4, 3},
		{"same pad2 dilated", []Option{WithDilation(1, 2), WithPadding(2, 2)}, 5, 6},
		{"stride (1,2) pad2", []Option{WithStride(1, 2), WithPadding(2, 1)}, 4, 5},
	}
	for _, c := range cases {
		l, err := NewConv2d(2, 3, 3, append(c.opts, WithRand(rng), WithDtype(tensor.Float64))...)
		if err != nil {
			t.Fatal(err)
		}
		x := randParam(rng, "x", 2, 2, c.h, c.w)
		want, oh, ow := directConv(x.Value.Float64s(), 2, 2, c.h, c.w, l)
		got := forward1(t, l, x.Value)
		if len(got) != len(want) {
			t.Fatalf("%s: %d outputs, want %d (%dx%d)", c.name, len(got), len(want), oh, ow)
		}
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-12 {
				t.Fatalf("%s: out[%d] = %v, direct %v", c.name, i, got[i], want[i])
			}
		}
		gradCheck(t, append(l.Params(), x), func(b *Builder) (*G.Node, error) {
			xn, _ := b.Node(x)
			y, err := l.Forward(b, xn)
			if err != nil {
				return nil, err
			}
			if !y.Shape().Eq(tensor.Shape{2, 3, oh, ow}) {
				t.Errorf("%s: shape %v, want [2 3 %d %d]", c.name, y.Shape(), oh, ow)
			}
			return weightedSum(b, rng, y)
		})
	}
}

func TestConv2dInit(t *testing.T) {
	l, err := NewConv2d(4, 8, 5, WithRand(rand.New(rand.NewPCG(1, 1))), WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	if !l.Weight.Value.Shape().Eq(tensor.Shape{8, 4, 5, 5}) || !l.Bias.Value.Shape().Eq(tensor.Shape{8}) {
		t.Errorf("shapes %v %v", l.Weight.Value.Shape(), l.Bias.Value.Shape())
	}
	bound := 1 / math.Sqrt(4*5*5)
	var mx float64
	for _, v := range l.Weight.Value.Float64s() {
		mx = math.Max(mx, math.Abs(v))
	}
	if mx > bound || mx < 0.95*bound {
		t.Errorf("max |w| %v, bound %v", mx, bound)
	}
	if _, err := NewConv2d(1, 1, 0, WithDtype(tensor.Float64)); err == nil {
		t.Error("kernel 0 accepted")
	}
}

func TestMaxPool2d(t *testing.T) {
	// 1x1x4x4, kernel 2: window maxima by hand; a tie in the last window.
	in := []float64{
		1, 5, 2, 0,
		3, 4, 8, 1,
		-1, -2, 7, 7,
		-3, -4, 7, 6,
	}
	p, err := NewMaxPool2d(2)
	if err != nil {
		t.Fatal(err)
	}
	got := forward1(t, p, tensor.New(tensor.WithShape(1, 1, 4, 4), tensor.WithBacking(in)))
	want := []float64{5, 8, -1, 7}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pool %v, want %v", got, want)
		}
	}
	// gradient of the sum: 1 at each window's first maximum
	x := &Param{Name: "x", Value: tensor.New(tensor.WithShape(1, 1, 4, 4), tensor.WithBacking(append([]float64(nil), in...))), RequiresGrad: true}
	b := NewBuilder(nil)
	xn, _ := b.Node(x)
	y, _ := p.Forward(b, xn)
	backwardSum(t, b, y)
	wantG := []float64{
		0, 1, 0, 0,
		0, 0, 1, 0,
		1, 0, 1, 0,
		0, 0, 0, 0,
	}
	for i, g := range x.Grad.Float64s() {
		if g != wantG[i] {
			t.Fatalf("pool grad %v, want %v", x.Grad.Float64s(), wantG)
		}
	}
	// padding (−∞), stride, odd sizes: shape and values by hand.
	p2, err := NewMaxPool2d(3, WithStride(2, 2), WithPadding(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	got = forward1(t, p2, tensor.New(tensor.WithShape(1, 1, 4, 4), tensor.WithBacking(in)))
	// windows rows [-1..1],[1..3] × cols [-1..1],[1..3]
	want = []float64{5, 8, 4, 8}
	if len(got) != 4 {
		t.Fatalf("padded pool gave %d outputs", len(got))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("padded pool %v, want %v", got, want)
		}
	}
	// random input (no ties): finite differences
	rng := rand.New(rand.NewPCG(5, 5))
	xr := randParam(rng, "x", 2, 3, 5, 7)
	gradCheck(t, []*Param{xr}, func(b *Builder) (*G.Node, error) {
		xn, _ := b.Node(xr)
		y, err := p2.Forward(b, xn)
		if err != nil {
			return nil, err
		}
		return weightedSum(b, rng, y)
	})
	if _, err := NewMaxPool2d(2, WithPadding(2, 2)); err == nil {
		t.Error("padding larger than half the kernel accepted")
	}
}

func TestFlatten(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	x := randParam(rng, "x", 2, 3, 2, 2)
	got := forward1(t, Flatten{}, x.Value)
	for i, v := range x.Value.Float64s() {
		if got[i] != v {
			t.Fatal("flatten reordered elements")
		}
	}
	// after a conv (whose output is a transposed view in gorgonia)
	l, _ := NewConv2d(3, 2, 1, WithRand(rng), WithDtype(tensor.Float64))
	lin, _ := NewLinear(8, 2, WithRand(rng), WithDtype(tensor.Float64))
	seq := NewSequential(l, Flatten{}, lin)
	gradCheck(t, append(seq.Params(), x), func(b *Builder) (*G.Node, error) {
		xn, _ := b.Node(x)
		y, err := seq.Forward(b, xn)
		if err != nil {
			return nil, err
		}
		return weightedSum(b, rng, y)
	})
}
