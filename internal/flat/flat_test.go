package flat

import (
	"slices"
	"testing"

	"gorgonia.org/tensor"
)

// TestBuf: every dtype comm moves gets a zeroed buffer of its element type,
// whose slices share memory, whose copies, zeroing, scaling (floats only)
// and first-element stores act on that memory; other types are refused.
func TestBuf(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64, tensor.Int8, tensor.Uint8, tensor.Int32, tensor.Int64} {
		b, ok := New(dt, 5)
		if !ok || b.Len() != 5 {
			t.Fatalf("%v: New = %v, %v", dt, b, ok)
		}
		if got := tensor.New(tensor.WithShape(5), tensor.WithBacking(b.Data())).Dtype(); got != dt {
			t.Fatalf("%v: the data is of dtype %v", dt, got)
		}
		if !slices.Equal(b.Float64s(), []float64{0, 0, 0, 0, 0}) {
			t.Fatalf("%v: a new buffer is not zero: %v", dt, b.Float64s())
		}
		one, _ := New(dt, 1)
		three := tensor.New(tensor.FromScalar(int8(3))).ScalarValue()
		if one.SetFirst(three) != (dt == tensor.Int8) {
			t.Fatalf("%v: SetFirst took an int8 into another type (or refused its own)", dt)
		}
		src, _ := New(dt, 2)
		for i := range 2 {
			s, _ := New(dt, 1)
			var x any
			switch dt {
			case tensor.Float32:
				x = float32(i + 2)
			case tensor.Float64:
				x = float64(i + 2)
			case tensor.Int8:
				x = int8(i + 2)
			case tensor.Uint8:
				x = uint8(i + 2)
			case tensor.Int32:
				x = int32(i + 2)
			case tensor.Int64:
				x = int64(i + 2)
			}
			if !s.SetFirst(x) {
				t.Fatalf("%v: SetFirst refused %T", dt, x)
			}
			src.CopyFrom(i, s)
		}
		if n := b.Slice(1, 4).CopyFrom(1, src); n != 2 {
			t.Fatalf("%v: CopyFrom copied %d elements, want 2", dt, n)
		}
		if want := []float64{0, 0, 2, 3, 0}; !slices.Equal(b.Float64s(), want) {
			t.Fatalf("%v: after a copy into a slice: %v, want %v", dt, b.Float64s(), want)
		}
		b.Scale(0.5)
		want := []float64{0, 0, 2, 3, 0}
		if dt == tensor.Float32 || dt == tensor.Float64 {
			want = []float64{0, 0, 1, 1.5, 0}
		}
		if !slices.Equal(b.Float64s(), want) {
			t.Fatalf("%v: after Scale(0.5): %v, want %v", dt, b.Float64s(), want)
		}
		b.Slice(2, 3).Zero()
		want[2] = 0
		if !slices.Equal(b.Float64s(), want) {
			t.Fatalf("%v: after zeroing a slice: %v, want %v", dt, b.Float64s(), want)
		}
		if c, ok := Of(b.Data()); !ok || c.Len() != 5 {
			t.Fatalf("%v: Of(Data()) = %v, %v", dt, c, ok)
		}
	}
	if _, ok := New(tensor.Bool, 3); ok || Supported(tensor.String) {
		t.Error("a dtype comm does not move was given a buffer")
	}
	if _, ok := Of([]int16{1}); ok {
		t.Error("Of took a []int16")
	}
	defer func() {
		if recover() == nil {
			t.Error("Must did not panic on a []bool")
		}
	}()
	Must([]bool{true})
}
