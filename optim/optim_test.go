package optim

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tandemml/tandem/models"
	"gorgonia.org/tensor"
)

func vec(xs ...float64) *tensor.Dense {
	return tensor.New(tensor.WithShape(len(xs)), tensor.WithBacking(append([]float64(nil), xs...)))
}

func randVec(r *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	return x
}

// refTorch replays torch.optim's single-tensor updates as whole-array passes,
// one torch operation per pass, in the order the Python code issues them. It
// shares no code with the kernels; the kernels fuse these passes into one
// loop, which must not change a bit.
type refTorch struct {
	kind                               string
	lr, mom, damp, wd, b1, b2, eps     float64
	nesterov, maximize, amsgrad        bool
	step                               int64
	buf, expAvg, expAvgSq, maxExpAvgSq []float64
}

func addAlpha(self, other []float64, alpha float64) []float64 { // self + alpha*other, fused
	out := make([]float64, len(self))
	for i := range self {
		out[i] = math.FMA(alpha, other[i], self[i])
	}
	return out
}

func (r *refTorch) update(p, grad []float64) {
	g := append([]float64(nil), grad...)
	if r.maximize {
		for i := range g {
			g[i] = -g[i]
		}
	}
	switch r.kind {
	case "sgd":
		if r.wd != 0 {
			g = addAlpha(g, p, r.wd)
		}
		if r.mom != 0 {
			if r.buf == nil {
				r.buf = append([]float64(nil), g...)
			} else {
				for i := range r.buf {
					r.buf[i] *= r.mom
				}
				r.buf = addAlpha(r.buf, g, 1-r.damp)
			}
			if r.nesterov {
				g = addAlpha(g, r.buf, r.mom)
			} else {
				g = r.buf
			}
		}
		copy(p, addAlpha(p, g, -r.lr))
	case "adam", "adamw":
		if r.expAvg == nil {
			r.expAvg, r.expAvgSq, r.maxExpAvgSq = make([]float64, len(p)), make([]float64, len(p)), make([]float64, len(p))
		}
		r.step++
		if r.kind == "adamw" {
			for i := range p {
				p[i] *= 1 - r.lr*r.wd
			}
		} else if r.wd != 0 {
			g = addAlpha(g, p, r.wd)
		}
		for i := range p {
			r.expAvg[i] *= r.b1
		}
		r.expAvg = addAlpha(r.expAvg, g, 1-r.b1)
		for i := range p {
			r.expAvgSq[i] *= r.b2
		}
		for i := range p { // addcmul_(g, g, value=1-b2)
			r.expAvgSq[i] = math.FMA((1-r.b2)*g[i], g[i], r.expAvgSq[i])
		}
		bc1, bc2 := 1-powInt(r.b1, r.step), 1-powInt(r.b2, r.step) // C's pow, see libm_test
		stepSize := r.lr / bc1
		v := r.expAvgSq
		if r.amsgrad {
			for i := range p {
				r.maxExpAvgSq[i] = math.Max(r.maxExpAvgSq[i], r.expAvgSq[i])
			}
			v = r.maxExpAvgSq
		}
		denom := make([]float64, len(p))
		for i := range p {
			denom[i] = math.Sqrt(v[i]) / math.Sqrt(bc2)
		}
		for i := range p {
			denom[i] += r.eps
		}
		for i := range p {
			p[i] += -stepSize * r.expAvg[i] / denom[i]
		}
	}
}

// TestKernelsMatchOpByOp covers the settings the golden files do not:
// dampening, maximize, AMSGrad, L2 decay in Adam, zero betas, across random
// sizes (including sizes that are not multiples of anything).
func TestKernelsMatchOpByOp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	type cfg struct {
		kind     string
		settings map[string]any
	}
	cfgs := []cfg{
		{"sgd", map[string]any{"lr": 0.1}},
		{"sgd", map[string]any{"lr": 0.03, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.02, "maximize": true}},
		{"sgd", map[string]any{"lr": 0.07, "momentum": 0.5, "nesterov": true, "weight_decay": 0.1}},
		{"adam", map[string]any{"lr": 0.01, "amsgrad": true, "weight_decay": 0.05}},
		{"adam", map[string]any{"lr": 0.2, "betas": []any{0.0, 0.5}, "eps": 1e-3, "maximize": true}},
		{"adamw", map[string]any{"lr": 0.01, "amsgrad": true, "maximize": true}},
		{"adamw", map[string]any{"lr": 0.05, "weight_decay": 0.3, "betas": []any{0.8, 0.99}}},
	}
	for _, c := range cfgs {
		n := 1 + rng.IntN(37)
		p := &models.Param{Name: "w", Value: vec(randVec(rng, n)...)}
		opt, err := New(c.kind, []*models.Param{p}, c.settings)
		if err != nil {
			t.Fatal(err)
		}
		f := func(k string, d float64) float64 {
			if v, ok := c.settings[k].(float64); ok {
				return v
			}
			return d
		}
		b := func(k string) bool { v, _ := c.settings[k].(bool); return v }
		ref := &refTorch{kind: c.kind, lr: f("lr", 1e-3), mom: f("momentum", 0), damp: f("dampening", 0),
			wd: f("weight_decay", map[bool]float64{true: 1e-2, false: 0}[c.kind == "adamw"]), b1: 0.9, b2: 0.999, eps: f("eps", 1e-8),
			nesterov: b("nesterov"), maximize: b("maximize"), amsgrad: b("amsgrad")}
		if bs, ok := c.settings["betas"].([]any); ok {
			ref.b1, ref.b2 = bs[0].(float64), bs[1].(float64)
		}
		want := append([]float64(nil), p.Value.Float64s()...)
		for s := 0; s < 12; s++ {
			g := randVec(rng, n)
			if s%4 == 3 { // shrinking gradients make AMSGrad's maximum matter
				for i := range g {
					g[i] *= 0.01
				}
			}
			p.Grad = vec(g...)
			ref.update(want, g)
			if err := opt.Step(); err != nil {
				t.Fatal(err)
			}
			for i, w := range want {
				if got := p.Value.Float64s()[i]; got != w {
					t.Fatalf("%s %v step %d element %d: kernel %.17g, op-by-op %.17g", c.kind, c.settings, s, i, got, w)
				}
			}
		}
	}
}

func TestMaximizeNegatesGradient(t *testing.T) {
	for _, kind := range []string{"sgd", "adam", "adamw"} {
		g := []float64{0.3, -1.2, 2.5}
		a := &models.Param{Value: vec(1, 2, 3)}
		b := &models.Param{Value: vec(1, 2, 3)}
		oa, err := New(kind, []*models.Param{a}, map[string]any{"lr": 0.1, "maximize": true})
		if err != nil {
			t.Fatal(err)
		}
		ob, _ := New(kind, []*models.Param{b}, map[string]any{"lr": 0.1})
		for s := 0; s < 3; s++ {
			a.Grad, b.Grad = vec(g...), vec(-g[0], -g[1], -g[2])
			if err := oa.Step(); err != nil {
				t.Fatal(err)
			}
			if err := ob.Step(); err != nil {
				t.Fatal(err)
			}
		}
		for i := range g {
			if a.Value.Float64s()[i] != b.Value.Float64s()[i] {
				t.Errorf("%s: maximize with g differs from minimize with -g: %v vs %v", kind, a.Value.Float64s(), b.Value.Float64s())
			}
		}
	}
}

func TestNilGradSkippedAndStateLazy(t *testing.T) {
	w := &models.Param{Name: "w", Value: vec(1, 2)}
	b := &models.Param{Name: "b", Value: vec(5)}
	opt, err := NewAdam([]*models.Param{w, b}, LR(0.1))
	if err != nil {
		t.Fatal(err)
	}
	w.Grad = vec(0.5, -0.5)
	if err := opt.Step(); err != nil {
		t.Fatal(err)
	}
	if b.Value.Float64s()[0] != 5 {
		t.Fatalf("parameter without gradient moved to %v", b.Value.Float64s())
	}
	st := opt.State()
	if _, ok := st["state.1.exp_avg"]; ok {
		t.Fatal("state created for a parameter that never had a gradient")
	}
	if v, _ := scalarOf(st["state.0.step"]); v != 1 {
		t.Fatalf("state.0.step = %v, want 1", v)
	}
	// b gets a gradient later: its own step count starts at 1 (bias
	// correction of a first step), as torch's per-parameter state does.
	b.Grad = vec(1)
	if err := opt.Step(); err != nil {
		t.Fatal(err)
	}
	st = opt.State()
	if v, _ := scalarOf(st["state.1.step"]); v != 1 {
		t.Fatalf("state.1.step = %v, want 1", v)
	}
	// Adam's first step moves by lr*g/(|g|+eps*...) ~ lr in the sign of g.
	if d := 5 - b.Value.Float64s()[0]; math.Abs(d-0.1) > 1e-6 {
		t.Fatalf("first Adam step of b moved it by %v, want ~0.1", d)
	}
}

func TestZeroGrad(t *testing.T) {
	w := &models.Param{Value: vec(1, 2), Grad: vec(3, 4)}
	n := &models.Param{Value: vec(1)}
	opt, _ := NewSGD([]*models.Param{w, n}, LR(0.1))
	g := w.Grad
	opt.ZeroGrad()
	if w.Grad != g || w.Grad.Float64s()[0] != 0 || w.Grad.Float64s()[1] != 0 {
		t.Fatalf("ZeroGrad: grad %v (same tensor: %v), want zeros in place", w.Grad.Float64s(), w.Grad == g)
	}
	if n.Grad != nil {
		t.Fatal("ZeroGrad created a gradient for a parameter that had none")
	}
}

func TestSettingsValidation(t *testing.T) {
	w := []*models.Param{{Value: vec(1)}}
	bad := []struct {
		name     string
		kind     string
		settings map[string]any
	}{
		{"unknown optimizer", "rmsprop", map[string]any{"lr": 0.1}},
		{"unknown setting", "sgd", map[string]any{"lr": 0.1, "centered": true}},
		{"adam setting on sgd", "sgd", map[string]any{"lr": 0.1, "betas": []any{0.9, 0.99}}},
		{"sgd setting on adam", "adam", map[string]any{"momentum": 0.9}},
		{"sgd without lr", "sgd", map[string]any{}},
		{"negative lr", "sgd", map[string]any{"lr": -1.0}},
		{"negative momentum", "sgd", map[string]any{"lr": 0.1, "momentum": -0.1}},
		{"nesterov without momentum", "sgd", map[string]any{"lr": 0.1, "nesterov": true}},
		{"nesterov with dampening", "sgd", map[string]any{"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": true}},
		{"negative weight decay", "adamw", map[string]any{"weight_decay": -0.1}},
		{"beta1 = 1", "adam", map[string]any{"betas": []any{1.0, 0.999}}},
		{"beta2 < 0", "adam", map[string]any{"betas": []any{0.9, -0.1}}},
		{"one beta", "adam", map[string]any{"betas": []any{0.9}}},
		{"negative eps", "adam", map[string]any{"eps": -1e-8}},
		{"lr as string", "adam", map[string]any{"lr": "0.1"}},
		{"amsgrad as number", "adam", map[string]any{"amsgrad": 1.0}},
		{"capturable", "adam", map[string]any{"capturable": true}},
		{"fused", "adamw", map[string]any{"fused": true}},
		{"differentiable adam", "adam", map[string]any{"differentiable": true}},
		{"NaN lr", "adam", map[string]any{"lr": math.NaN()}},
	}
	for _, c := range bad {
		if _, err := New(c.kind, w, c.settings); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: New(%q, %v) = %v, want ErrInvalidArgument", c.name, c.kind, c.settings, err)
		}
	}
	good := []struct {
		kind     string
		settings map[string]any
	}{
		{"sgd", map[string]any{"lr": 0.1, "foreach": true, "differentiable": true, "maximize": false}},
		{"SGD", map[string]any{"lr": 0, "foreach": nil}},
		{"adam", map[string]any{"capturable": false, "fused": false, "differentiable": false, "foreach": false}},
		{"adamw", map[string]any{"fused": nil, "amsgrad": true, "betas": []any{0.0, 0.0}, "eps": 0.0}},
	}
	for _, c := range good {
		if _, err := New(c.kind, w, c.settings); err != nil {
			t.Errorf("New(%q, %v): %v", c.kind, c.settings, err)
		}
	}
	if _, err := NewAdam(w, Momentum(0.9)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewAdam with Momentum: %v, want ErrInvalidArgument", err)
	}
	if _, err := NewSGD(w, LR(0.1), AMSGrad(true)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewSGD with AMSGrad: %v, want ErrInvalidArgument", err)
	}
	if _, err := NewSGD(w, Momentum(0.9)); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "optim.LR") {
		t.Errorf("NewSGD without LR: %v, want ErrInvalidArgument naming optim.LR", err)
	}
	for name, o := range map[string]func() (Optimizer, error){
		"SGD":   func() (Optimizer, error) { return NewSGD(w, LR(0.25)) },
		"Adam":  func() (Optimizer, error) { return NewAdam(w, LR(0.25)) },
		"AdamW": func() (Optimizer, error) { return NewAdamW(w, LR(0.25)) },
	} {
		opt, err := o()
		if err != nil {
			t.Fatalf("%s with LR: %v", name, err)
		}
		if opt.LR() != 0.25 {
			t.Errorf("%s: LR() = %v, want 0.25 (the same option sets the rate of every optimizer)", name, opt.LR())
		}
	}
}

func TestBadTensors(t *testing.T) {
	ints := &models.Param{Value: tensor.New(tensor.WithShape(2), tensor.WithBacking([]int64{1, 2}))}
	if _, err := NewSGD([]*models.Param{ints}, LR(0.1)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("int64 parameter: %v, want ErrInvalidArgument", err)
	}
	if _, err := NewSGD([]*models.Param{nil}, LR(0.1)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil parameter: %v, want ErrInvalidArgument", err)
	}
	w := &models.Param{Value: vec(1, 2)}
	v := &models.Param{Value: vec(1, 2)}
	opt, _ := NewSGD([]*models.Param{v, w}, LR(0.1))
	v.Grad = vec(1, 1)
	for name, g := range map[string]*tensor.Dense{
		"shape": vec(1, 2, 3),
		"dtype": tensor.New(tensor.WithShape(2), tensor.WithBacking([]float32{1, 2})),
	} {
		w.Grad = g
		if err := opt.Step(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s mismatch: %v, want ErrInvalidArgument", name, err)
		}
		if v.Value.Float64s()[0] != 1 {
			t.Fatalf("a failed Step changed another parameter: %v", v.Value.Float64s())
		}
	}
}

func TestFloat32ScalarParam(t *testing.T) {
	p := &models.Param{Value: tensor.New(tensor.FromScalar(float32(2))), Grad: tensor.New(tensor.FromScalar(float32(0.5)))}
	opt, err := NewSGD([]*models.Param{p}, LR(0.1), Momentum(0.9))
	if err != nil {
		t.Fatal(err)
	}
	if err := opt.Step(); err != nil {
		t.Fatal(err)
	}
	if got := p.Value.Float32s()[0]; got != float32(2)-float32(0.1)*float32(0.5) {
		t.Fatalf("scalar float32 parameter after one step: %v", got)
	}
}

// TestStateRoundTrip saves state mid-run, loads it into a fresh optimizer and
// checks that both continue bit-identically.
func TestStateRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		kind     string
		settings map[string]any
	}{
		{"sgd", map[string]any{"lr": 0.1, "momentum": 0.9, "nesterov": true}},
		{"adam", map[string]any{"lr": 0.01, "amsgrad": true}},
		{"adamw", map[string]any{"lr": 0.01}},
	} {
		mk := func(init []float64) (*models.Param, *models.Param, Optimizer) {
			a := &models.Param{Value: vec(init...)}
			b := &models.Param{Value: vec(init[:2]...)} // never gets a gradient
			o, err := New(c.kind, []*models.Param{a, b}, c.settings)
			if err != nil {
				t.Fatal(err)
			}
			return a, b, o
		}
		a, _, oa := mk([]float64{1, -2, 3})
		for s := 0; s < 4; s++ {
			a.Grad = vec(randVec(rng, 3)...)
			if err := oa.Step(); err != nil {
				t.Fatal(err)
			}
		}
		oa.SetLR(oa.LR() / 2)
		saved := oa.State()
		if _, ok := saved["state.1.exp_avg"]; ok {
			t.Fatal("state saved for a parameter never stepped")
		}
		b, _, ob := mk(a.Value.Float64s())
		if err := ob.LoadState(saved); err != nil {
			t.Fatal(err)
		}
		if ob.LR() != oa.LR() {
			t.Fatalf("%s: LoadState lr %v, want %v", c.kind, ob.LR(), oa.LR())
		}
		// The loaded state must be a copy: scribbling on the map changes nothing.
		for _, v := range saved {
			v.Zero()
		}
		for s := 0; s < 5; s++ {
			g := randVec(rng, 3)
			a.Grad, b.Grad = vec(g...), vec(g...)
			if err := oa.Step(); err != nil {
				t.Fatal(err)
			}
			if err := ob.Step(); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 3 {
			if a.Value.Float64s()[i] != b.Value.Float64s()[i] {
				t.Fatalf("%s: resumed run differs: %v vs %v", c.kind, b.Value.Float64s(), a.Value.Float64s())
			}
		}
		// Malformed maps are refused.
		st := oa.State()
		for name, mutate := range map[string]func(m map[string]*tensor.Dense){
			"unknown key": func(m map[string]*tensor.Dense) { m["state.0.velocity"] = vec(1, 2, 3) },
			"bad index":   func(m map[string]*tensor.Dense) { m["state.7.exp_avg"] = vec(1, 2, 3) },
			"wrong shape": func(m map[string]*tensor.Dense) {
				m["state.0.exp_avg"] = vec(1, 2)
				m["state.0.momentum_buffer"] = vec(1, 2)
			},
			"not state":      func(m map[string]*tensor.Dense) { m["lr"] = vec(1) },
			"missing buffer": func(m map[string]*tensor.Dense) { delete(m, "state.0.exp_avg") },
			"step of sgd":    func(m map[string]*tensor.Dense) { m["state.0.step"] = tensor.New(tensor.FromScalar(float32(2))) },
		} {
			if (c.kind == "sgd") != (name == "step of sgd") && (name == "missing buffer" || name == "step of sgd") {
				continue // SGD has no exp_avg to miss; Adam's step is legitimate
			}
			m := map[string]*tensor.Dense{}
			for k, v := range st {
				m[k] = v
			}
			mutate(m)
			if err := ob.LoadState(m); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%s: LoadState(%s) = %v, want ErrInvalidArgument", c.kind, name, err)
			}
		}
	}
}
