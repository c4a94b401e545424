package optim

import (
	"fmt"
	"math"

	"github.com/tandemml/tandem/models"
	"gorgonia.org/tensor"
)

// Adam is the Adam optimizer (torch.optim.Adam, 1.13), or AdamW
// (torch.optim.AdamW) when built by NewAdamW. For each parameter p with
// gradient g at step t:
//
//	g = -g                        if maximize
//	p = p*(1 - lr*wd)             AdamW: decoupled weight decay
//	g = g + wd*p                  Adam: L2 weight decay, if wd != 0
//	m = beta1*m + (1-beta1)*g
//	v = beta2*v + (1-beta2)*g*g
//	vmax = max(vmax, v)           if amsgrad (and v below is vmax)
//	denom = sqrt(v)/sqrt(1-beta2^t) + eps
//	p = p - (lr/(1-beta1^t)) * m / denom
type Adam struct {
	base
	beta1, beta2, eps, weightDecay float64
	amsgrad, maximize, decoupled   bool
	state                          []*adamState // nil until the parameter's first step
}

// adamState is one parameter's state.
type adamState struct {
	step                          int64
	expAvg, expAvgSq, maxExpAvgSq *tensor.Dense // maxExpAvgSq only with amsgrad
}

var adamSettings = []string{"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"}

// NewAdam returns an Adam optimizer over params. Options: LR (default 1e-3),
// Betas (0.9, 0.999), Eps (1e-8), WeightDecay (0, an L2 penalty added to the
// gradient), AMSGrad, Maximize. Settings torch rejects (negative lr, eps or
// weight decay; a beta outside [0, 1)) are errors wrapping ErrInvalidArgument.
func NewAdam(params []*models.Param, opts ...Option) (*Adam, error) {
	return newAdam("Adam", false, 0, params, opts)
}

// NewAdamW returns an AdamW optimizer: Adam with decoupled weight decay, which
// multiplies each parameter by 1 - lr*weight_decay before the Adam update.
// Options as NewAdam; WeightDecay defaults to 1e-2, as in torch.optim.AdamW.
func NewAdamW(params []*models.Param, opts ...Option) (*Adam, error) {
	return newAdam("AdamW", true, 1e-2, params, opts)
}

func newAdam(name string, decoupled bool, wd float64, params []*models.Param, opts []Option) (*Adam, error) {
	c := config{lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: wd}
	if err := c.apply(name, adamSettings, opts); err != nil {
		return nil, err
	}
	for _, kv := range []struct {
		n string
		v float64
	}{{"lr", c.lr}, {"beta1", c.beta1}, {"beta2", c.beta2}, {"eps", c.eps}, {"weight_decay", c.weightDecay}} {
		if err := validFinite(name, kv.n, kv.v); err != nil {
			return nil, err
		}
	}
	switch {
	case c.lr < 0:
		return nil, fmt.Errorf("optim: %s: invalid learning rate %v (must be >= 0): %w", name, c.lr, ErrInvalidArgument)
	case c.eps < 0:
		return nil, fmt.Errorf("optim: %s: invalid eps %v (must be >= 0): %w", name, c.eps, ErrInvalidArgument)
	case c.beta1 < 0 || c.beta1 >= 1:
		return nil, fmt.Errorf("optim: %s: invalid beta1 %v (must be in [0, 1)): %w", name, c.beta1, ErrInvalidArgument)
	case c.beta2 < 0 || c.beta2 >= 1:
		return nil, fmt.Errorf("optim: %s: invalid beta2 %v (must be in [0, 1)): %w", name, c.beta2, ErrInvalidArgument)
	case c.weightDecay < 0:
		return nil, fmt.Errorf("optim: %s: invalid weight_decay %v (must be >= 0): %w", name, c.weightDecay, ErrInvalidArgument)
	}
	b, err := newBase(name, params)
	if err != nil {
		return nil, err
	}
	b.lr = c.lr
	return &Adam{base: b, beta1: c.beta1, beta2: c.beta2, eps: c.eps, weightDecay: c.weightDecay,
		amsgrad: c.amsgrad, maximize: c.maximize, decoupled: decoupled,
		state: make([]*adamState, len(params))}, nil
}

// Step applies one Adam (or AdamW) update to every parameter with a gradient.
func (o *Adam) Step() error {
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
		st := o.state[i]
		if st == nil {
			st = &adamState{expAvg: zerosLike(p.Value), expAvgSq: zerosLike(p.Value)}
			if o.amsgrad {
				st.maxExpAvgSq = zerosLike(p.Value)
			}
			o.state[i] = st
		}
		st.step++
		c := o.consts(st.step)
		switch p.Value.Dtype() {
		case tensor.Float64:
			var vmax []float64
			if st.maxExpAvgSq != nil {
				vmax = st.maxExpAvgSq.Float64s()
			}
			adamKernel(p.Value.Float64s(), p.Grad.Float64s(), st.expAvg.Float64s(), st.expAvgSq.Float64s(), vmax, c)
		case tensor.Float32:
			var vmax []float32
			if st.maxExpAvgSq != nil {
				vmax = st.maxExpAvgSq.Float32s()
			}
			adamKernel(p.Value.Float32s(), p.Grad.Float32s(), st.expAvg.Float32s(), st.expAvgSq.Float32s(), vmax, c)
		}
	}
	return nil
}

// adamConsts are the scalars of one Adam step as Python computes them, in
// float64; the kernel rounds them to its element type.
type adamConsts struct {
	decay                   float64 // AdamW: 1 - lr*wd
	weightDecay             float64 // Adam: the L2 coefficient
	beta1, oneMinusBeta1    float64
	beta2, oneMinusBeta2    float64
	negStepSize, bc2Sqrt    float64
	eps                     float64
	maximize, decoupled, l2 bool
}

func (o *Adam) consts(step int64) adamConsts {
	bc1 := 1 - powInt(o.beta1, step)
	bc2 := 1 - powInt(o.beta2, step)
	return adamConsts{
		decay:         1 - float64(o.lr*o.weightDecay),
		weightDecay:   o.weightDecay,
		beta1:         o.beta1,
		oneMinusBeta1: 1 - o.beta1,
		beta2:         o.beta2,
		oneMinusBeta2: 1 - o.beta2,
		negStepSize:   -(o.lr / bc1),
		bc2Sqrt:       math.Sqrt(bc2),
		eps:           o.eps,
		maximize:      o.maximize,
		decoupled:     o.decoupled,
		l2:            !o.decoupled && o.weightDecay != 0,
	}
}

// adamScalars32 are the float32 scalars of the vector Adam kernel, in the
// order it loads them.
type adamScalars32 struct {
	decay, omb1, b1, omb2, b2, bc2s, eps, negStep, wd float32
	l2                                                uint32 // 1: Adam's L2 decay
}

// adamKernel updates p, m (exp_avg), v (exp_avg_sq) and, with AMSGrad, vmax
// in place, one element at a time in torch's operation order.
func adamKernel[T float](p, g, m, v, vmax []T, c adamConsts) {
	decay, wd := T(c.decay), T(c.weightDecay)
	b1, omb1, b2, omb2 := T(c.beta1), T(c.oneMinusBeta1), T(c.beta2), T(c.oneMinusBeta2)
	negStep, bc2s, eps := T(c.negStepSize), T(c.bc2Sqrt), T(c.eps)
	maximize, decoupled, l2, ams := c.maximize, c.decoupled, c.l2, vmax != nil
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	if ams {
		vmax = vmax[:len(p)]
	}
	if p32, ok := any(p).([]float32); ok && !maximize && !ams {
		k := adamScalars32{decay: 1, omb1: float32(omb1), b1: float32(b1), omb2: float32(omb2), b2: float32(b2),
			bc2s: float32(bc2s), eps: float32(eps), negStep: float32(negStep), wd: float32(wd)}
		if decoupled {
			k.decay = float32(decay)
		}
		if l2 {
			k.l2 = 1
		}
		if adam32(p32, any(g).([]float32), any(m).([]float32), any(v).([]float32), &k) {
			return
		}
	}
	for i := range p {
		gi, pi := g[i], p[i]
		if maximize {
			gi = -gi
		}
		if decoupled {
			pi = T(pi * decay)
		} else if l2 {
			gi = fma(wd, pi, gi)
		}
		mi := fma(omb1, gi, T(m[i]*b1))
		vi := fma(T(omb2*gi), gi, T(v[i]*b2))
		m[i], v[i] = mi, vi
		if ams {
			vi = maximum(vmax[i], vi)
			vmax[i] = vi
		}
		denom := T(sqrt(vi)/bc2s) + eps
		p[i] = pi + T(negStep*mi)/denom
	}
}

// State returns copies of each stepped parameter's step (a float32 scalar, as
// torch keeps it), exp_avg, exp_avg_sq and, with AMSGrad, max_exp_avg_sq,
// plus the learning rate.
func (o *Adam) State() map[string]*tensor.Dense {
	m := map[string]*tensor.Dense{}
	o.lrState(m)
	for i, st := range o.state {
		if st == nil {
			continue
		}
		m[stateKey(i, "step")] = tensor.New(tensor.FromScalar(float32(st.step)))
		m[stateKey(i, "exp_avg")] = cloneDense(st.expAvg)
		m[stateKey(i, "exp_avg_sq")] = cloneDense(st.expAvgSq)
		if st.maxExpAvgSq != nil {
			m[stateKey(i, "max_exp_avg_sq")] = cloneDense(st.maxExpAvgSq)
		}
	}
	return m
}

// LoadState restores what State saved. With AMSGrad every stepped parameter
// needs max_exp_avg_sq; without it the entry is refused.
func (o *Adam) LoadState(state map[string]*tensor.Dense) error {
	known := map[string]bool{"step": true, "exp_avg": true, "exp_avg_sq": true, "max_exp_avg_sq": true}
	ls, err := parseState(o.name, o.params, state, known)
	if err != nil {
		return err
	}
	sts := make([]*adamState, len(o.params))
	for i := range o.params {
		bs := ls.bufs[i]
		if len(bs) == 0 && ls.steps[i] < 0 {
			continue
		}
		st := &adamState{step: ls.steps[i], expAvg: bs["exp_avg"], expAvgSq: bs["exp_avg_sq"], maxExpAvgSq: bs["max_exp_avg_sq"]}
		var missing []string
		if st.step < 0 {
			missing = append(missing, "step")
		}
		if st.expAvg == nil {
			missing = append(missing, "exp_avg")
		}
		if st.expAvgSq == nil {
			missing = append(missing, "exp_avg_sq")
		}
		if o.amsgrad && st.maxExpAvgSq == nil {
			missing = append(missing, "max_exp_avg_sq")
		}
		if len(missing) > 0 {
			return fmt.Errorf("optim: %s: state for parameter %d lacks %v: %w", o.name, i, missing, ErrInvalidArgument)
		}
		if !o.amsgrad && st.maxExpAvgSq != nil {
			return fmt.Errorf("optim: %s: state for parameter %d holds max_exp_avg_sq but AMSGrad is off: %w", o.name, i, ErrInvalidArgument)
		}
		sts[i] = st
	}
	o.state = sts
	if ls.hasLR {
		o.lr = ls.lr
	}
	return nil
}
