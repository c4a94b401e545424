package rpc

import (
	"reflect"

	"gorgonia.org/tensor"
)

// Tensors returns the tensors a value carries, in the order they travel
// (each once), looking where the codec looks: exported struct fields,
// slices, arrays, maps, pointers, interfaces and Any. Types that encode
// themselves (Marshaler, such as rref.RRef) are opaque. Interceptors use it
// to find the tensors of an argument or a result (distributed autograd
// records a send or a receive for each).
func Tensors(v any) []*tensor.Dense {
	w := tensorWalker{seen: map[*tensor.Dense]bool{}}
	if v != nil {
		w.walk(reflect.ValueOf(v), 0)
	}
	return w.out
}

type tensorWalker struct {
	out  []*tensor.Dense
	seen map[*tensor.Dense]bool
}

func (w *tensorWalker) add(t *tensor.Dense) {
	if t != nil && !w.seen[t] {
		w.seen[t] = true
		w.out = append(w.out, t)
	}
}

func (w *tensorWalker) walk(v reflect.Value, depth int) {
	if !v.IsValid() || depth > maxDepth {
		return
	}
	t := v.Type()
	if t == denseType {
		w.add(v.Interface().(*tensor.Dense))
		return
	}
	if t == anyType {
		a := v.Interface().(Any)
		if a.set {
			if a.val != nil {
				w.walk(reflect.ValueOf(a.val), depth+1)
			}
			return
		}
		for _, x := range a.tensors {
			w.add(x)
		}
		return
	}
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface && reflect.PointerTo(t).Implements(marshalerType) {
		return
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			w.walk(v.Elem(), depth+1)
		}
	case reflect.Slice, reflect.Array:
		if rawElem(t.Elem()) || t.Elem().Kind() == reflect.String || t.Elem().Kind() == reflect.Bool {
			return
		}
		for i := 0; i < v.Len(); i++ {
			w.walk(v.Index(i), depth+1)
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			w.walk(it.Key(), depth+1)
			w.walk(it.Value(), depth+1)
		}
	case reflect.Struct:
		for _, i := range structFields(t) {
			w.walk(v.Field(i), depth+1)
		}
	}
}
