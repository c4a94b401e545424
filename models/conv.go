package models

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

// Conv2d is PyTorch's nn.Conv2d with groups=1 over NCHW inputs: Weight is
// [out, in, kh, kw], Bias is [out] (nil without bias), both drawn from
// U(-1/√fan_in, 1/√fan_in) with fan_in = in·kh·kw, as PyTorch's default.
// Stride, zero padding and dilation are per axis (height, width).
type Conv2d struct {
	In, Out                           int
	Kernel, Stride, Padding, Dilation [2]int
	Weight, Bias                      *Param
}

// NewConv2d returns a Conv2d from in to out channels with a square kernel.
// Options: WithKernel (rectangular), WithStride, WithPadding, WithDilation,
// WithBias, WithDtype, WithRand.
func NewConv2d(in, out, kernel int, opts ...Option) (*Conv2d, error) {
	c := newConfig(opts)
	l := &Conv2d{In: in, Out: out, Kernel: [2]int{kernel, kernel}, Stride: [2]int{1, 1}, Dilation: [2]int{1, 1}}
	if c.kernel != nil {
		l.Kernel = *c.kernel
	}
	if c.stride != nil {
		l.Stride = *c.stride
	}
	if c.padding != nil {
		l.Padding = *c.padding
	}
	if c.dilation != nil {
		l.Dilation = *c.dilation
	}
	if in <= 0 || out <= 0 {
		return nil, fmt.Errorf("models: Conv2d needs positive channel counts, got in=%d out=%d: %w", in, out, errs.InvalidArgument)
	}
	for i := 0; i < 2; i++ {
		if l.Kernel[i] <= 0 || l.Stride[i] <= 0 || l.Dilation[i] <= 0 || l.Padding[i] < 0 {
			return nil, fmt.Errorf("models: Conv2d kernel %v stride %v dilation %v padding %v: all must be positive (padding non-negative): %w",
				l.Kernel, l.Stride, l.Dilation, l.Padding, errs.InvalidArgument)
		}
	}
	if err := checkFloat(c.dtype); err != nil {
		return nil, fmt.Errorf("%w: %w", errs.InvalidArgument, err)
	}
	l.Weight, l.Bias = weightBias(c, in*l.Kernel[0]*l.Kernel[1], out, in, l.Kernel[0], l.Kernel[1])
	return l, nil
}

// Params returns weight then bias.
func (l *Conv2d) Params() []*Param { return paramsOf(l.Weight, l.Bias) }

// Buffers returns nothing.
func (l *Conv2d) Buffers() []*Param { return nil }

// Forward convolves x of shape [N, in, H, W] into [N, out, H', W'] with
// H' = floor((H + 2·pad - dilation·(kh-1) - 1)/stride) + 1 (likewise W'):
// per sample one GEMM over an im2col matrix (see convOp), then the bias per
// channel. The backward pass is exact: GEMMs for the weight and input
// gradients and a col2im that adds every product back where it came from.
func (l *Conv2d) Forward(b *Builder, x *G.Node) (*G.Node, error) { return l.forward(b, x, false) }

// forwardReLU is Forward followed by ReLU, with the bias and the ReLU in one
// pass (Sequential uses it for a Conv2d followed by a ReLU).
func (l *Conv2d) forwardReLU(b *Builder, x *G.Node) (*G.Node, error) { return l.forward(b, x, true) }

func (l *Conv2d) forward(b *Builder, x *G.Node, relu bool) (*G.Node, error) {
	xs := x.Shape()
	if len(xs) != 4 || xs[1] != l.In {
		return nil, fmt.Errorf("models: Conv2d(%d, %d) needs input [N, %d, H, W], got %v: %w", l.In, l.Out, l.In, xs, errs.InvalidArgument)
	}
	for i := 0; i < 2; i++ {
		if xs[2+i]+2*l.Padding[i] < l.Dilation[i]*(l.Kernel[i]-1)+1 {
			return nil, fmt.Errorf("models: Conv2d kernel %v (dilation %v) larger than padded input %v: %w", l.Kernel, l.Dilation, xs, errs.InvalidArgument)
		}
	}
	w, err := b.Node(l.Weight)
	if err != nil {
		return nil, err
	}
	y, err := conv2d(b, x, w, convParams{k: l.Kernel, s: l.Stride, p: l.Padding, d: l.Dilation})
	if err != nil {
		return nil, fmt.Errorf("models: Conv2d(%d, %d): %w", l.In, l.Out, err)
	}
	return addBias(b, y, l.Bias, relu)
}

// Flatten reshapes [N, d1, d2, ...] to [N, d1·d2·...], like PyTorch's
// nn.Flatten() with its defaults (start_dim=1, end_dim=-1).
type Flatten struct{}

// Params returns nothing.
func (Flatten) Params() []*Param { return nil }

// Buffers returns nothing.
func (Flatten) Buffers() []*Param { return nil }

// Forward flattens all axes after the first.
func (Flatten) Forward(_ *Builder, x *G.Node) (*G.Node, error) {
	s := x.Shape()
	if len(s) < 2 {
		return nil, fmt.Errorf("models: Flatten needs at least 2 axes, got shape %v: %w", s, errs.InvalidArgument)
	}
	if len(s) == 2 {
		return x, nil
	}
	return G.Reshape(x, tensor.Shape{s[0], s.TotalSize() / s[0]})
}
