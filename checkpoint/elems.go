package checkpoint

import (
	"reflect"

	"gorgonia.org/tensor"
)

// elems returns the elements of a contiguous tensor as a typed slice, also
// for scalars (whose Data is a bare value rather than a slice).
func elems(t *tensor.Dense) any {
	d := t.Data()
	if !t.IsScalar() {
		return d
	}
	v := reflect.ValueOf(d)
	s := reflect.MakeSlice(reflect.SliceOf(v.Type()), 1, 1)
	s.Index(0).Set(v)
	return s.Interface()
}
