package autograd

import (
	"fmt"
	"reflect"
	"sort"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/rpc"
)

// tensorsOf lists the tensors a value carries, in an order that the sender
// and the receiver of an RPC agree on: it visits what the rpc codec sends
// (exported struct fields not tagged `rpc:"-"` in declaration order, slice
// and array elements in order, map entries by the printed form of their
// keys, pointers, interfaces holding a tensor) and lists each tensor once,
// at its first visit. Values that encode themselves (rpc.Marshaler, such as
// rref.RRef) and rpc.Any are opaque: tensors inside them are not tracked.
func tensorsOf(v any) []*tensor.Dense {
	if v == nil {
		return nil
	}
	if t, ok := v.(*tensor.Dense); ok {
		if t == nil {
			return nil
		}
		return []*tensor.Dense{t}
	}
	w := walker{seen: map[*tensor.Dense]bool{}}
	w.value(reflect.ValueOf(v), 0)
	return w.out
}

type walker struct {
	out  []*tensor.Dense
	seen map[*tensor.Dense]bool
}

var (
	denseType     = reflect.TypeFor[*tensor.Dense]()
	marshalerType = reflect.TypeFor[rpc.Marshaler]()
)

const maxWalkDepth = 100

func (w *walker) add(t *tensor.Dense) {
	if t != nil && !w.seen[t] {
		w.seen[t] = true
		w.out = append(w.out, t)
	}
}

func (w *walker) value(v reflect.Value, depth int) {
	if !v.IsValid() || depth > maxWalkDepth {
		return
	}
	t := v.Type()
	if t == denseType {
		w.add(v.Interface().(*tensor.Dense))
		return
	}
	if !mayHoldTensors(t, 0) {
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			w.value(v.Elem(), depth+1)
		}
	case reflect.Interface:
		if !v.IsNil() {
			if d, ok := v.Elem().Interface().(*tensor.Dense); ok {
				w.add(d)
			}
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < v.Len(); i++ {
			w.value(v.Index(i), depth+1)
		}
	case reflect.Map:
		keys := v.MapKeys()
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = fmt.Sprint(k.Interface())
		}
		idx := make([]int, len(keys))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return names[idx[a]] < names[idx[b]] })
		for _, i := range idx {
			w.value(keys[i], depth+1)
			w.value(v.MapIndex(keys[i]), depth+1)
		}
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() || f.Tag.Get("rpc") == "-" {
				continue
			}
			w.value(v.Field(i), depth+1)
		}
	}
}

// mayHoldTensors reports whether a value of type t can carry a tensor that
// the walk would find (false for numbers, strings, self-encoding types).
func mayHoldTensors(t reflect.Type, depth int) bool {
	if depth > 20 {
		return true
	}
	if t == denseType {
		return true
	}
	if t.Kind() != reflect.Interface && (t.Implements(marshalerType) || reflect.PointerTo(t).Implements(marshalerType)) {
		return false
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return mayHoldTensors(t.Elem(), depth+1)
	case reflect.Map:
		return mayHoldTensors(t.Key(), depth+1) || mayHoldTensors(t.Elem(), depth+1)
	case reflect.Interface:
		return true
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.IsExported() && f.Tag.Get("rpc") != "-" && mayHoldTensors(f.Type, depth+1) {
				return true
			}
		}
	}
	return false
}
