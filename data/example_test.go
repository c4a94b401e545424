package data_test

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/data"
)

// Batches of an in-memory data set, shuffled per epoch.
func ExampleNewLoader() {
	// Six examples of two features each; example i is [i, 10*i] with label i%3.
	x := make([]float32, 0, 12)
	labels := make([]int, 0, 6)
	for i := 0; i < 6; i++ {
		x = append(x, float32(i), float32(10*i))
		labels = append(labels, i%3)
	}
	ds, err := data.NewInMemory([]int{2}, x, labels)
	if err != nil {
		panic(err)
	}
	loader, err := data.NewLoader(ds, 4, data.Prefetch(2))
	if err != nil {
		panic(err)
	}
	for batch, err := range loader.Epoch(context.Background(), 0) {
		if err != nil {
			panic(err)
		}
		fmt.Println(batch.Index, batch.X.Shape(), batch.X.Data(), batch.Labels())
	}
	// Output:
	// 0 (4, 2) [0 0 1 10 2 20 3 30] [0 1 2 0]
	// 1 (2, 2) [4 40 5 50] [1 2]
}

// A regression data set of two inputs and a float target, sharded for rank 1
// of 2 by the same DistributedSampler a labelled data set uses.
func ExampleNewTensorLoader() {
	const n = 6
	query := make([]float32, 0, 2*n) // example i: [i, -i]
	item := make([]int64, 0, n)      // example i: 100+i
	target := make([]float64, 0, n)  // example i: i/4
	for i := range n {
		query = append(query, float32(i), -float32(i))
		item = append(item, int64(100+i))
		target = append(target, float64(i)/4)
	}
	ds, err := data.NewTensorDataset([]string{"query", "item", "target"},
		tensor.New(tensor.WithShape(n, 2), tensor.WithBacking(query)),
		tensor.New(tensor.WithShape(n), tensor.WithBacking(item)),
		tensor.New(tensor.WithShape(n), tensor.WithBacking(target)))
	if err != nil {
		panic(err)
	}
	sampler, err := data.NewDistributedSampler(ds.Len(), 2, 1, data.NoShuffle())
	if err != nil {
		panic(err)
	}
	loader, err := data.NewTensorLoader(ds, 2, data.WithSampler(sampler))
	if err != nil {
		panic(err)
	}
	for batch, err := range loader.Epoch(context.Background(), 0) {
		if err != nil {
			panic(err)
		}
		fmt.Println(batch.Indices, batch.Tensor("query").Data(), batch.Tensor("item").Data(), batch.Tensor("target").Data())
	}
	// Output:
	// [1 3] [1 -1 3 -3] [101 103] [0.25 0.75]
	// [5] [5 -5] [105] [1.25]
}

// Each of three ranks gets its own share of ten examples; torch pads the
// order to twelve by repeating its head.
func ExampleNewDistributedSampler() {
	for rank := 0; rank < 3; rank++ {
		s, err := data.NewDistributedSampler(10, 3, rank, data.NoShuffle())
		if err != nil {
			panic(err)
		}
		fmt.Println(rank, s.Indices(0))
	}
	// Output:
	// 0 [0 3 6 9]
	// 1 [1 4 7 0]
	// 2 [2 5 8 1]
}

// Load Fashion-MNIST's test split wherever it is installed (TANDEM_DATA,
// Debian's dataset-fashion-mnist) or downloadable; flattened images suit an
// MLP.
func ExampleFashionMNIST() {
	test, err := data.FashionMNIST(context.Background(), "test", data.Flatten(), data.NoDownload())
	if err != nil {
		fmt.Println("Fashion-MNIST is not installed:", err != nil)
		return
	}
	_ = test // test.Len() == 10000, test.Shape() == [784]
}
