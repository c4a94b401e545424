package ddp

import (
	"reflect"
	"testing"

	"gorgonia.org/tensor"
)

func TestAssignBuckets(t *testing.T) {
	f32, f64 := tensor.Float32, tensor.Float64
	cases := []struct {
		name   string
		order  []int
		bytes  []int64
		dtypes []tensor.Dtype
		limits []int64
		want   [][]int
	}{
		{
			// MLP 784-1024-1024-10 in float32, parameters in reverse order,
			// first bucket 1 MiB, the others 25 MiB: the first bucket closes
			// on 2.weight, which crosses 1 MiB; the rest stays open.
			name:   "mlp reverse order",
			order:  []int{5, 4, 3, 2, 1, 0},
			bytes:  []int64{784 * 1024 * 4, 1024 * 4, 1024 * 1024 * 4, 1024 * 4, 10 * 1024 * 4, 10 * 4},
			dtypes: []tensor.Dtype{f32, f32, f32, f32, f32, f32},
			limits: []int64{1 << 20, 25 << 20},
			want:   [][]int{{5, 4, 3, 2}, {1, 0}},
		},
		{
			// The parameter that reaches the cap joins the bucket it fills;
			// after the first bucket the second cap applies.
			name:   "caps",
			order:  []int{0, 1, 2, 3, 4, 5},
			bytes:  []int64{60, 50, 100, 10, 10, 300},
			dtypes: []tensor.Dtype{f64, f64, f64, f64, f64, f64},
			limits: []int64{100, 120},
			want:   [][]int{{0, 1}, {2, 3, 4}, {5}},
		},
		{
			name:   "exact cap closes",
			order:  []int{2, 1, 0},
			bytes:  []int64{8, 8, 16},
			dtypes: []tensor.Dtype{f64, f64, f64},
			limits: []int64{16},
			want:   [][]int{{2}, {1, 0}},
		},
		{
			// One open bucket per dtype, each with its own cap sequence;
			// buckets are ordered by the position of their first parameter.
			name:   "dtypes apart",
			order:  []int{0, 1, 2, 3, 4},
			bytes:  []int64{40, 40, 40, 40, 40},
			dtypes: []tensor.Dtype{f32, f64, f32, f64, f32},
			limits: []int64{80, 1000},
			want:   [][]int{{0, 2}, {1, 3}, {4}},
		},
		{
			name:   "everything in one",
			order:  []int{3, 2, 1, 0},
			bytes:  []int64{1, 1, 1, 1},
			dtypes: []tensor.Dtype{f64, f64, f64, f64},
			limits: []int64{1 << 20, 25 << 20},
			want:   [][]int{{3, 2, 1, 0}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := assignBuckets(c.order, c.bytes, c.dtypes, c.limits)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestBucketLimits(t *testing.T) {
	c := defaultConfig()
	if got := c.bucketLimits(); got[0] != 1<<20 || got[1] != 25<<20 {
		t.Errorf("default limits %v", got)
	}
	if err := BucketCapMB(0.5)(&c); err != nil {
		t.Fatal(err)
	}
	if got := c.bucketLimits(); got[0] != 1<<19 || got[1] != 1<<19 {
		t.Errorf("with a cap below 1 MiB the first bucket shares it: %v", got)
	}
	if err := FirstBucketCapMB(2)(&c); err != nil {
		t.Fatal(err)
	}
	if got := c.bucketLimits(); got[0] != 2<<20 || got[1] != 1<<19 {
		t.Errorf("explicit first cap: %v", got)
	}
	for _, bad := range []Option{BucketCapMB(0), BucketCapMB(-1), FirstBucketCapMB(0), Workers(0), WithLoss(nil), MaxPrograms(0)} {
		if err := bad(&c); err == nil {
			t.Error("a bad option was accepted")
		}
	}
}

func TestViewsShareTheBucket(t *testing.T) {
	buf := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(10))
	v := viewOf(buf, 4, tensor.Shape{2, 3})
	v.Float64s()[5] = 7
	if buf.Float64s()[9] != 7 {
		t.Fatalf("view does not share the buffer: %v", buf.Float64s())
	}
	if !v.Shape().Eq(tensor.Shape{2, 3}) {
		t.Fatalf("shape %v", v.Shape())
	}
	s := viewOf(buf, 2, tensor.Shape{})
	s.Float64s()[0] = 3
	if buf.Float64s()[2] != 3 || !s.IsScalar() {
		t.Fatalf("scalar view: %v %v", buf.Float64s(), s.Shape())
	}
}
