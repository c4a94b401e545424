package rpc

import (
	"fmt"
	"reflect"
)

// Extension is a package built on rpc that an agent installs when asked,
// with WithExtensions: rref (rref.Extension) and distributed autograd
// (autograd.Extension) are extensions. Init installs each extension after
// the rendezvous and before the agent serves its first call, so every
// worker that was given it serves its protocol from the start; a worker
// that was not given it serves none of it, and the package's functions
// fail on it with an error saying so.
//
// Install registers the extension's functions (in the agent's registry:
// Register and RegisterAsync are idempotent, so agents sharing a registry
// may each install them), adds interceptors (UseClient, UseServer), hooks
// (OnShutdown, OnClose) and background work (Go), and returns the
// extension's state for this agent, which Agent.Extension returns under
// Name from then on.
//
// An extension that needs others installed before it (distributed
// autograd needs rref) says so with a method Requires() []Extension:
// Init installs those first, whether or not they were listed.
type Extension interface {
	// Name names the extension: an agent has at most one extension of
	// each name.
	Name() string
	// Install installs the extension on a, returning its state.
	Install(a *Agent) (state any, err error)
}

// requirer is an extension that needs others installed before it.
type requirer interface {
	Requires() []Extension
}

// WithExtensions installs the given extensions on the agent (see
// Extension), in order, each after the extensions it requires. Giving the
// same extension twice, here or across several WithExtensions, installs it
// once; two different extensions of one name fail Init with
// ErrInvalidArgument.
func WithExtensions(exts ...Extension) Option {
	return func(o *options) { o.extensions = append(o.extensions, exts...) }
}

// resolveExtensions orders the extensions to install: each one's
// requirements first, each name once.
func resolveExtensions(exts []Extension) ([]Extension, error) {
	var out []Extension
	byName := map[string]Extension{}
	visiting := map[string]bool{}
	var visit func(e Extension) error
	visit = func(e Extension) error {
		if e == nil {
			return fmt.Errorf("%w: rpc: init: a nil extension", ErrInvalidArgument)
		}
		name := e.Name()
		if prev, ok := byName[name]; ok {
			if !sameExtension(prev, e) {
				return fmt.Errorf("%w: rpc: init: two different extensions are named %q (%T and %T); give each its own name", ErrInvalidArgument, name, prev, e)
			}
			return nil
		}
		if visiting[name] {
			return fmt.Errorf("%w: rpc: init: extension %q requires itself, through the extensions it requires", ErrInvalidArgument, name)
		}
		visiting[name] = true
		if r, ok := e.(requirer); ok {
			for _, dep := range r.Requires() {
				if err := visit(dep); err != nil {
					return err
				}
			}
		}
		visiting[name] = false
		byName[name] = e
		out = append(out, e)
		return nil
	}
	for _, e := range exts {
		if err := visit(e); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sameExtension reports whether two extensions of one name are the same
// value (== on values of one comparable type; never for other types).
func sameExtension(a, b Extension) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	if ta != tb {
		return false
	}
	if ta.Comparable() {
		return a == b
	}
	return false
}
