package data

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"

	"gorgonia.org/tensor"
)

// Field describes one tensor of every example of a TensorSet: its name, its
// element type and the shape of one example's slice of it (empty for one
// value per example, such as a class label or a regression target).
type Field struct {
	Name  string
	Dtype tensor.Dtype
	Shape []int
}

// size is the number of elements of one example's field.
func (f Field) size() int {
	n := 1
	for _, d := range f.Shape {
		n *= d
	}
	return n
}

// TensorSet is a data set whose examples are several tensors of any element
// type: two inputs and a float target, an image and its mask, a sequence and
// its length. A Loader built by NewTensorLoader serves its batches, one
// tensor per field, through the same samplers as a Dataset's.
type TensorSet interface {
	// Len is the number of examples.
	Len() int
	// Fields describes the tensors of one example, the same for all.
	Fields() []Field
	// Read writes example i into dst: dst[f] is a slice of field f's Go
	// element type ([]float32, []float64, []int64, ...) that holds exactly
	// one example's elements, a row of the batch being built. It is called
	// from several goroutines at once when the Loader has several workers.
	Read(i int, dst []any) error
}

// TensorDataset is a TensorSet held in memory, PyTorch's TensorDataset:
// example i is row i (along the first axis) of each of its tensors.
type TensorDataset struct {
	fields []Field
	data   []reflect.Value // each tensor's backing slice
	n      int
}

// NewTensorDataset returns the data set whose example i is row i of each of
// tensors, which must agree on their first dimension (the number of
// examples) and may have any element type and any further dimensions; a
// tensor of shape [N] gives one value per example. names names the fields
// (unique, non-empty); nil names them by position, "0", "1", ... . The
// tensors are used, not copied, and must be contiguous.
func NewTensorDataset(names []string, tensors ...*tensor.Dense) (*TensorDataset, error) {
	if len(tensors) == 0 {
		return nil, fmt.Errorf("data: a TensorDataset needs at least one tensor: %w", ErrInvalidArgument)
	}
	if names == nil {
		for i := range tensors {
			names = append(names, strconv.Itoa(i))
		}
	}
	if len(names) != len(tensors) {
		return nil, fmt.Errorf("data: TensorDataset: %d names for %d tensors: %w", len(names), len(tensors), ErrInvalidArgument)
	}
	d := &TensorDataset{n: -1}
	for i, t := range tensors {
		if names[i] == "" || slices.Contains(names[:i], names[i]) {
			return nil, fmt.Errorf("data: TensorDataset: field %d has an empty or repeated name %q: %w", i, names[i], ErrInvalidArgument)
		}
		if t == nil || t.IsScalar() || t.Dims() == 0 {
			return nil, fmt.Errorf("data: TensorDataset: field %q needs a tensor with a first axis of examples: %w", names[i], ErrInvalidArgument)
		}
		if !t.IsNativelyAccessible() || t.RequiresIterator() {
			return nil, fmt.Errorf("data: TensorDataset: field %q is a view; pass a contiguous tensor (t.Materialize()): %w", names[i], ErrInvalidArgument)
		}
		shape := t.Shape()
		if d.n >= 0 && shape[0] != d.n {
			return nil, fmt.Errorf("data: TensorDataset: field %q has %d examples, field %q has %d: %w", names[i], shape[0], names[0], d.n, ErrInvalidArgument)
		}
		d.n = shape[0]
		d.fields = append(d.fields, Field{Name: names[i], Dtype: t.Dtype(), Shape: slices.Clone(shape[1:])})
		d.data = append(d.data, reflect.ValueOf(t.Data()))
	}
	return d, nil
}

// Len is the number of examples.
func (d *TensorDataset) Len() int { return d.n }

// Fields describes the tensors of one example.
func (d *TensorDataset) Fields() []Field {
	out := make([]Field, len(d.fields))
	for i, f := range d.fields {
		out[i] = Field{Name: f.Name, Dtype: f.Dtype, Shape: slices.Clone(f.Shape)}
	}
	return out
}

// Read copies example i's row of every tensor into dst.
func (d *TensorDataset) Read(i int, dst []any) error {
	if i < 0 || i >= d.n {
		return fmt.Errorf("data: example %d out of range [0, %d): %w", i, d.n, ErrInvalidArgument)
	}
	if len(dst) != len(d.fields) {
		return fmt.Errorf("data: %d destinations for %d fields: %w", len(dst), len(d.fields), ErrInvalidArgument)
	}
	for f, field := range d.fields {
		size := field.size()
		to := reflect.ValueOf(dst[f])
		if to.Kind() != reflect.Slice || to.Type() != d.data[f].Type() || to.Len() != size {
			return fmt.Errorf("data: field %q: destination %T of length %d for an example of %d %v: %w",
				field.Name, dst[f], to.Len(), size, field.Dtype, ErrInvalidArgument)
		}
		reflect.Copy(to, d.data[f].Slice(i*size, (i+1)*size))
	}
	return nil
}

// rowOf returns elements [lo, hi) of buf, a tensor's backing slice, without
// reflection for the common element types.
func rowOf(buf any, lo, hi int) any {
	switch s := buf.(type) {
	case []float32:
		return s[lo:hi:hi]
	case []float64:
		return s[lo:hi:hi]
	case []int64:
		return s[lo:hi:hi]
	case []int32:
		return s[lo:hi:hi]
	case []int:
		return s[lo:hi:hi]
	case []uint8:
		return s[lo:hi:hi]
	case []bool:
		return s[lo:hi:hi]
	}
	return reflect.ValueOf(buf).Slice3(lo, hi, hi).Interface()
}
