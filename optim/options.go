package optim

import (
	"fmt"
	"math"
	"strings"

	"github.com/tandemml/tandem/internal/optset"
)

// Option sets one hyperparameter of an optimizer. Options that do not apply
// to the optimizer being built (Momentum for Adam, Betas for SGD) make the
// constructor fail rather than be ignored.
type Option func(*config)

// config holds every hyperparameter of the three optimizers and remembers
// which ones the caller set, so that constructors can refuse foreign ones.
type config struct {
	lr          float64
	momentum    float64
	dampening   float64
	weightDecay float64
	nesterov    bool
	maximize    bool
	beta1       float64
	beta2       float64
	eps         float64
	amsgrad     bool
	set         optset.Set
}

func (c *config) mark(name string) {
	c.set.Mark(name)
}

// LR sets the learning rate (torch: lr). Adam's and AdamW's default is 1e-3;
// SGD has none, so NewSGD requires LR, as torch 1.13 does.
func LR(lr float64) Option { return func(c *config) { c.lr = lr; c.mark("lr") } }

// Momentum sets SGD's momentum factor (default 0: no momentum buffer).
func Momentum(m float64) Option { return func(c *config) { c.momentum = m; c.mark("momentum") } }

// Dampening sets SGD's dampening of the momentum (default 0).
func Dampening(d float64) Option { return func(c *config) { c.dampening = d; c.mark("dampening") } }

// Nesterov turns on Nesterov momentum for SGD (needs momentum > 0 and zero
// dampening).
func Nesterov(on bool) Option { return func(c *config) { c.nesterov = on; c.mark("nesterov") } }

// WeightDecay sets the weight decay. For SGD and Adam it is an L2 penalty
// added to the gradient (default 0); for AdamW it is decoupled, shrinking the
// parameter by lr*wd before the update (default 1e-2).
func WeightDecay(wd float64) Option {
	return func(c *config) { c.weightDecay = wd; c.mark("weight_decay") }
}

// Maximize makes the optimizer ascend the objective instead of descending it
// (the gradient is negated before anything else, as torch 1.13 does).
func Maximize(on bool) Option { return func(c *config) { c.maximize = on; c.mark("maximize") } }

// Betas sets Adam's and AdamW's running-average coefficients (default 0.9,
// 0.999).
func Betas(beta1, beta2 float64) Option {
	return func(c *config) { c.beta1, c.beta2 = beta1, beta2; c.mark("betas") }
}

// Eps sets the term Adam and AdamW add to the denominator (default 1e-8).
func Eps(eps float64) Option { return func(c *config) { c.eps = eps; c.mark("eps") } }

// AMSGrad turns on the AMSGrad variant of Adam and AdamW, which divides by the
// running maximum of the second moment.
func AMSGrad(on bool) Option { return func(c *config) { c.amsgrad = on; c.mark("amsgrad") } }

// apply runs opts over c and fails if one of them is not in allowed.
func (c *config) apply(optimizer string, allowed []string, opts []Option) error {
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("optim: %s: nil option: %w", optimizer, ErrInvalidArgument)
		}
		o(c)
	}
	if foreign := c.set.Foreign(allowed); len(foreign) > 0 {
		return fmt.Errorf("optim: %s does not take %s (it takes %s): %w",
			optimizer, strings.Join(foreign, ", "), strings.Join(allowed, ", "), ErrInvalidArgument)
	}
	return nil
}

// validFinite reports an error when v is NaN or infinite.
func validFinite(optimizer, name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("optim: %s: %s must be a finite number, got %v: %w", optimizer, name, v, ErrInvalidArgument)
	}
	return nil
}
