package optim

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tandemml/tandem/models"
)

// New builds an optimizer from its torch.optim name ("sgd", "adam", "adamw",
// case-insensitive) and torch.optim's keyword arguments as decoded from JSON:
// numbers as float64 (or int), flags as bool, betas as a two-element list.
// Settings left out take torch's defaults; SGD needs "lr", as in torch.
//
// Accepted keys follow torch 1.13's signatures:
//
//	sgd:   lr momentum dampening weight_decay nesterov maximize foreach differentiable
//	adam:  lr betas eps weight_decay amsgrad maximize foreach capturable differentiable fused
//	adamw: the same as adam
//
// foreach (true, false or null) picks torch's multi-tensor kernels, whose
// arithmetic on CPU equals the single-tensor loop, so it changes nothing here.
// SGD's differentiable only records the update for autograd, so it changes
// nothing here either. capturable and fused need CUDA in torch, and Adam's
// differentiable path computes its bias corrections in float32; those three
// are accepted only when false or null. An unknown optimizer, an unknown key,
// a value of the wrong type or an unsupported value is an error wrapping
// ErrInvalidArgument.
func New(name string, params []*models.Param, settings map[string]any) (Optimizer, error) {
	opt := strings.ToLower(name)
	var keys []string
	switch opt {
	case "sgd":
		keys = []string{"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable"}
	case "adam", "adamw":
		keys = []string{"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused"}
	default:
		return nil, fmt.Errorf("optim: unknown optimizer %q (known: sgd, adam, adamw): %w", name, ErrInvalidArgument)
	}
	names := make([]string, 0, len(settings))
	for k := range settings {
		names = append(names, k)
	}
	sort.Strings(names)
	var opts []Option
	hasLR := false
	for _, k := range names {
		v := settings[k]
		known := false
		for _, a := range keys {
			known = known || a == k
		}
		if !known {
			return nil, fmt.Errorf("optim: %s: unknown setting %q (accepted: %s): %w", opt, k, strings.Join(keys, ", "), ErrInvalidArgument)
		}
		bad := func(want string) error {
			return fmt.Errorf("optim: %s: setting %q must be %s, got %v (%T): %w", opt, k, want, v, v, ErrInvalidArgument)
		}
		switch k {
		case "lr", "momentum", "dampening", "weight_decay", "eps":
			f, ok := number(v)
			if !ok {
				return nil, bad("a number")
			}
			switch k {
			case "lr":
				opts, hasLR = append(opts, LR(f)), true
			case "momentum":
				opts = append(opts, Momentum(f))
			case "dampening":
				opts = append(opts, Dampening(f))
			case "weight_decay":
				opts = append(opts, WeightDecay(f))
			case "eps":
				opts = append(opts, Eps(f))
			}
		case "nesterov", "maximize", "amsgrad":
			b, ok := v.(bool)
			if !ok {
				return nil, bad("true or false")
			}
			switch k {
			case "nesterov":
				opts = append(opts, Nesterov(b))
			case "maximize":
				opts = append(opts, Maximize(b))
			case "amsgrad":
				opts = append(opts, AMSGrad(b))
			}
		case "betas":
			l, ok := v.([]any)
			if !ok || len(l) != 2 {
				return nil, bad("a list of two numbers")
			}
			b1, ok1 := number(l[0])
			b2, ok2 := number(l[1])
			if !ok1 || !ok2 {
				return nil, bad("a list of two numbers")
			}
			opts = append(opts, Betas(b1, b2))
		case "foreach":
			if _, ok := v.(bool); !ok && v != nil {
				return nil, bad("true, false or null")
			}
		case "differentiable", "capturable", "fused":
			b, ok := v.(bool)
			if !ok && v != nil {
				return nil, bad("true, false or null")
			}
			if b && !(opt == "sgd" && k == "differentiable") {
				return nil, fmt.Errorf("optim: %s: %s=true is not supported (it selects a CUDA-only or float32 code path of torch); use false: %w",
					opt, k, ErrInvalidArgument)
			}
		}
	}
	switch opt {
	case "sgd":
		if !hasLR {
			return nil, fmt.Errorf("optim: sgd: setting \"lr\" is required: %w", ErrInvalidArgument)
		}
		return NewSGD(params, opts...)
	case "adam":
		return NewAdam(params, opts...)
	default:
		return NewAdamW(params, opts...)
	}
}

// number reads a JSON number (float64) or a Go integer or float.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	}
	return 0, false
}
