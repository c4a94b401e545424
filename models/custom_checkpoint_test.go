package models_test

import (
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/models"
)

// A user-written module saves and loads through checkpoint like a ready
// model, under the keys PyTorch's state_dict gives the same module.
func TestCustomModuleCheckpoint(t *testing.T) {
	src, err := NewPairScorer(3, 2, 4, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	dst, err := NewPairScorer(3, 2, 4, rand.New(rand.NewPCG(2, 2)))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pair.safetensors")
	if err := checkpoint.SaveModule(path, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.LoadInto(dst, path); err != nil {
		t.Fatal(err)
	}
	for i, p := range models.StateDict(dst) {
		if q := models.StateDict(src)[i]; p.Name != q.Name || !reflect.DeepEqual(p.Value.Data(), q.Value.Data()) {
			t.Fatalf("%s did not load from %s", p.Name, q.Name)
		}
	}

	// the keys torch would write for the same module
	keys := map[string][]int{"mix": {4, 4}, "query.weight": {4, 3}, "query.bias": {4}, "item.weight": {4, 2}, "item.bias": {4}}
	torchLike := map[string]*tensor.Dense{}
	for k, shape := range keys {
		torchLike[k] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(shape...))
		torchLike[k].Float32s()[0] = 7
	}
	torchPath := filepath.Join(t.TempDir(), "torch.safetensors")
	if err := checkpoint.SaveMap(torchPath, torchLike, nil); err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.LoadInto(dst, torchPath); err != nil {
		t.Fatalf("a checkpoint with torch's keys: %v", err)
	}
	if dst.Query.Bias.Value.Float32s()[0] != 7 || dst.Mix.Value.Float32s()[1] != 0 {
		t.Fatal("the torch-keyed checkpoint did not land in the module's tensors")
	}
}
