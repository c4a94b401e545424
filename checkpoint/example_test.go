package checkpoint_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/models"
)

func Example() {
	dir, _ := os.MkdirTemp("", "ckpt")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "mlp.safetensors")

	src, _ := models.NewMLP([]int{4, 8, 2}, models.WithRand(rand.New(rand.NewPCG(1, 2))))
	if err := checkpoint.SaveModule(path, src, map[string]string{"format": "pt"}); err != nil {
		fmt.Println(err)
		return
	}
	f, _ := checkpoint.Load(path)
	for _, t := range f.Tensors {
		fmt.Println(t.Name, t.Tensor.Shape(), f.Dtypes[t.Name])
	}

	dst, _ := models.NewMLP([]int{4, 8, 2})
	fmt.Println(checkpoint.LoadInto(dst, path))

	wrong, _ := models.NewMLP([]int{4, 16, 2})
	fmt.Println(checkpoint.LoadInto(wrong, path) != nil)
	// Output:
	// 0.weight (8, 4) F32
	// 0.bias (8) F32
	// 2.weight (2, 8) F32
	// 2.bias (2) F32
	// <nil>
	// true
}
