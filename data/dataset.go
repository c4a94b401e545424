package data

import (
	"fmt"
)

// Dataset is an indexable collection of labelled examples whose features all
// have the same shape.
type Dataset interface {
	// Len is the number of examples.
	Len() int
	// Shape is the shape of one example's features, e.g. [1, 28, 28].
	Shape() []int
	// Get writes example i's features into x, which holds exactly the
	// product of Shape() elements, and returns its class label. It is called
	// from several goroutines at once when a Loader has several workers.
	Get(i int, x []float32) (label int, err error)
}

// InMemory is a Dataset held in memory: one []float32 with every example's
// features back to back, and one label per example.
type InMemory struct {
	shape  []int
	size   int
	x      []float32
	labels []int
}

// NewInMemory returns a data set of len(labels) examples of the given shape
// whose features are x, example after example (so len(x) must be
// len(labels) times the product of shape). The slices are used, not copied.
func NewInMemory(shape []int, x []float32, labels []int) (*InMemory, error) {
	size := 1
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("data: example shape %v has a non-positive dimension: %w", shape, ErrInvalidArgument)
		}
		size *= d
	}
	if len(x) != size*len(labels) {
		return nil, fmt.Errorf("data: %d labels of examples shaped %v need %d feature values, got %d: %w",
			len(labels), shape, size*len(labels), len(x), ErrInvalidArgument)
	}
	return &InMemory{shape: append([]int(nil), shape...), size: size, x: x, labels: labels}, nil
}

// Len is the number of examples.
func (d *InMemory) Len() int { return len(d.labels) }

// Shape is the shape of one example.
func (d *InMemory) Shape() []int { return append([]int(nil), d.shape...) }

// Get copies example i into x and returns its label.
func (d *InMemory) Get(i int, x []float32) (int, error) {
	if i < 0 || i >= len(d.labels) {
		return 0, fmt.Errorf("data: example %d out of range [0, %d): %w", i, len(d.labels), ErrInvalidArgument)
	}
	if len(x) != d.size {
		return 0, fmt.Errorf("data: buffer of %d values for an example of %d: %w", len(x), d.size, ErrInvalidArgument)
	}
	copy(x, d.x[i*d.size:(i+1)*d.size])
	return d.labels[i], nil
}

// Features returns example i's features (a view into the data set; do not
// modify it).
func (d *InMemory) Features(i int) []float32 { return d.x[i*d.size : (i+1)*d.size : (i+1)*d.size] }

// Label returns example i's label.
func (d *InMemory) Label(i int) int { return d.labels[i] }
