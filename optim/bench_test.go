package optim

import (
	"testing"

	"github.com/tandemml/tandem/models"
	"gorgonia.org/tensor"
)

// Step throughput on a 1M-element parameter: go test -bench . ./optim
func benchStep(b *testing.B, kind string, dt tensor.Dtype, settings map[string]any) {
	const n = 1 << 20
	v := tensor.New(tensor.WithShape(n), tensor.Of(dt))
	g := tensor.New(tensor.WithShape(n), tensor.Of(dt))
	p := &models.Param{Value: v, Grad: g}
	opt, err := New(kind, []*models.Param{p}, settings)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(n * int64(dt.Size()))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := opt.Step(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSGDMomentum64(b *testing.B) {
	benchStep(b, "sgd", tensor.Float64, map[string]any{"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4})
}
func BenchmarkSGDMomentum32(b *testing.B) {
	benchStep(b, "sgd", tensor.Float32, map[string]any{"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4})
}
func BenchmarkAdam64(b *testing.B)  { benchStep(b, "adam", tensor.Float64, map[string]any{}) }
func BenchmarkAdam32(b *testing.B)  { benchStep(b, "adam", tensor.Float32, map[string]any{}) }
func BenchmarkAdamW64(b *testing.B) { benchStep(b, "adamw", tensor.Float64, map[string]any{}) }

// The two SGD loops most training runs: plain, and momentum alone.
func BenchmarkSGDPlain32(b *testing.B) {
	benchStep(b, "sgd", tensor.Float32, map[string]any{"lr": 0.01})
}
func BenchmarkSGDMomentumOnly32(b *testing.B) {
	benchStep(b, "sgd", tensor.Float32, map[string]any{"lr": 0.05, "momentum": 0.9})
}
