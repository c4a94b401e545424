package optim

import (
	"fmt"
	"math"

	"github.com/tandemml/tandem/models"
	"gorgonia.org/tensor"
)

// SGD is stochastic gradient descent with optional momentum, dampening,
// Nesterov momentum, L2 weight decay and maximisation, following
// torch.optim.SGD (1.13). For each parameter p with gradient g:
//
//	g = -g                              if maximize
//	g = g + wd*p                        if wd != 0
//	buf = g (first step) or momentum*buf + (1-dampening)*g
//	g = g + momentum*buf (Nesterov) or g = buf    if momentum != 0
//	p = p - lr*g
type SGD struct {
	base
	momentum, dampening, weightDecay float64
	nesterov, maximize               bool
	bufs                             []*tensor.Dense // momentum buffers, nil until first used
}

var sgdSettings = []string{"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"}

// NewSGD returns an SGD optimizer over params. Options: LR (required, as
// torch 1.13's lr has no default for SGD), Momentum, Dampening, Nesterov,
// WeightDecay, Maximize:
//
//	opt, err := optim.NewSGD(model.Params(), optim.LR(0.1), optim.Momentum(0.9))
//
// A missing LR and invalid settings (negative lr, momentum or weight decay;
// Nesterov without momentum or with dampening) are errors wrapping
// ErrInvalidArgument, as torch's constructor raises on them.
func NewSGD(params []*models.Param, opts ...Option) (*SGD, error) {
	var c config
	if err := c.apply("SGD", sgdSettings, opts); err != nil {
		return nil, err
	}
	if !c.set["lr"] {
		return nil, fmt.Errorf("optim: SGD: the learning rate is required (pass optim.LR(x)): %w", ErrInvalidArgument)
	}
	for _, kv := range []struct {
		n string
		v float64
	}{{"lr", c.lr}, {"momentum", c.momentum}, {"dampening", c.dampening}, {"weight_decay", c.weightDecay}} {
		if err := validFinite("SGD", kv.n, kv.v); err != nil {
			return nil, err
		}
	}
	switch {
	case c.lr < 0:
		return nil, fmt.Errorf("optim: SGD: invalid learning rate %v (must be >= 0): %w", c.lr, ErrInvalidArgument)
	case c.momentum < 0:
		return nil, fmt.Errorf("optim: SGD: invalid momentum %v (must be >= 0): %w", c.momentum, ErrInvalidArgument)
	case c.weightDecay < 0:
		return nil, fmt.Errorf("optim: SGD: invalid weight_decay %v (must be >= 0): %w", c.weightDecay, ErrInvalidArgument)
	case c.nesterov && (c.momentum <= 0 || c.dampening != 0):
		return nil, fmt.Errorf("optim: SGD: Nesterov momentum needs momentum > 0 and dampening 0 (got momentum %v, dampening %v): %w",
			c.momentum, c.dampening, ErrInvalidArgument)
	}
	b, err := newBase("SGD", params)
	if err != nil {
		return nil, err
	}
	b.lr = c.lr
	return &SGD{base: b, momentum: c.momentum, dampening: c.dampening, weightDecay: c.weightDecay,
		nesterov: c.nesterov, maximize: c.maximize, bufs: make([]*tensor.Dense, len(params))}, nil
}

// Step applies one SGD update to every parameter that has a gradient.
func (o *SGD) Step() error {
	for i, p := range o.params {
		if p.Grad == nil {
			continue
		}
		if err := o.checkGrad(i, p); err != nil {
			return err
		}
	}
	for i, p := range o.params {
		if p.Grad == nil {
			continue
		}
		first := false
		if o.momentum != 0 && o.bufs[i] == nil {
			o.bufs[i] = zerosLike(p.Value)
			first = true
		}
		switch p.Value.Dtype() {
		case tensor.Float64:
			var buf []float64
			if o.bufs[i] != nil {
				buf = o.bufs[i].Float64s()
			}
			sgdKernel(p.Value.Float64s(), p.Grad.Float64s(), buf, first, o.consts())
		case tensor.Float32:
			var buf []float32
			if o.bufs[i] != nil {
				buf = o.bufs[i].Float32s()
			}
			sgdKernel(p.Value.Float32s(), p.Grad.Float32s(), buf, first, o.consts())
		}
	}
	return nil
}

// sgdConsts are SGD's scalars as Python computes them, in float64; the kernel
// rounds them to its element type.
type sgdConsts struct {
	negLR, weightDecay, momentum, oneMinusDampening float64
	nesterov, maximize                              bool
}

func (o *SGD) consts() sgdConsts {
	return sgdConsts{negLR: -o.lr, weightDecay: o.weightDecay, momentum: o.momentum,
		oneMinusDampening: 1 - o.dampening, nesterov: o.nesterov, maximize: o.maximize}
}

// sgdKernel updates p in place. buf is nil without momentum; first says the
// buffer is being created by this step (it becomes a copy of the gradient).
// The settings are copied into locals so the loop tests registers, not the
// struct, and the momentum-free case has its own loop.
func sgdKernel[T float](p, g, buf []T, first bool, c sgdConsts) {
	negLR, wd, mom, damp := T(c.negLR), T(c.weightDecay), T(c.momentum), T(c.oneMinusDampening)
	maximize, hasWD, nesterov := c.maximize, c.weightDecay != 0, c.nesterov
	g = g[:len(p)]
	if buf == nil && !maximize && !hasWD {
		plainSGD(p, g, c.negLR)
		return
	}
	if p32, ok := any(p).([]float32); ok && !maximize && (buf == nil || !first && !nesterov) {
		g32 := any(g).([]float32)
		if buf == nil && sgdPlain32(p32, g32, float32(negLR), float32(wd), hasWD) ||
			buf != nil && sgdMomentum32(p32, g32, any(buf).([]float32)[:len(p)], float32(mom), float32(damp), float32(negLR), float32(wd), hasWD) {
			return
		}
	}
	if buf == nil {
		for i := range p {
			d := g[i]
			if maximize {
				d = -d
			}
			if hasWD {
				d = fma(wd, p[i], d)
			}
			p[i] = fma(negLR, d, p[i])
		}
		return
	}
	buf = buf[:len(p)]
	for i := range p {
		d := g[i]
		if maximize {
			d = -d
		}
		if hasWD {
			d = fma(wd, p[i], d)
		}
		b := d
		if !first {
			b = fma(damp, d, T(buf[i]*mom))
		}
		buf[i] = b
		if nesterov {
			d = fma(mom, b, d)
		} else {
			d = b
		}
		p[i] = fma(negLR, d, p[i])
	}
}

// plainSGD is the step without momentum, weight decay or maximize, the hot
// loop of most training: p += -lr·g with one rounding, as torch's fused
// add_(g, alpha=-lr). Each element type gets its own loop so that the
// learning rate is converted once, not per element.
func plainSGD[T float](p, g []T, negLR float64) {
	switch p := any(p).(type) {
	case []float32:
		g := any(g).([]float32)[:len(p)]
		if sgdPlain32(p, g, float32(negLR), 0, false) { // torch rounds alpha to the tensor's dtype
			return
		}
		negLR := float32(negLR)
		for i := range p {
			p[i] = fma32(negLR, g[i], p[i])
		}
	case []float64:
		g := any(g).([]float64)[:len(p)]
		for i := range p {
			p[i] = math.FMA(negLR, g[i], p[i])
		}
	}
}

// State returns copies of the momentum buffers ("state.<i>.momentum_buffer")
// and the learning rate.
func (o *SGD) State() map[string]*tensor.Dense {
	m := map[string]*tensor.Dense{}
	o.lrState(m)
	for i, b := range o.bufs {
		if b != nil {
			m[stateKey(i, "momentum_buffer")] = cloneDense(b)
		}
	}
	return m
}

// LoadState restores momentum buffers and the learning rate saved by State.
func (o *SGD) LoadState(state map[string]*tensor.Dense) error {
	ls, err := parseState(o.name, o.params, state, map[string]bool{"momentum_buffer": true})
	if err != nil {
		return err
	}
	bufs := make([]*tensor.Dense, len(o.params))
	for i, bs := range ls.bufs {
		if len(bs) == 0 {
			continue
		}
		if o.momentum == 0 {
			return fmt.Errorf("optim: SGD: state holds a momentum buffer for parameter %d but momentum is 0: %w", i, ErrInvalidArgument)
		}
		b, ok := bs["momentum_buffer"]
		if !ok {
			return fmt.Errorf("optim: SGD: state for parameter %d lacks momentum_buffer: %w", i, ErrInvalidArgument)
		}
		bufs[i] = b
	}
	o.bufs = bufs
	if ls.hasLR {
		o.lr = ls.lr
	}
	return nil
}
