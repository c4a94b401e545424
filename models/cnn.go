package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/tandemml/tandem/internal/errs"
)

// CNNConfig sizes NewCNN's network. The zero value of a field means its
// default.
type CNNConfig struct {
	InChannels int // input channels (default 1)
	Size       int // input height and width (default 28); must be divisible by 4
	Channels1  int // channels of the first convolution (default 16)
	Channels2  int // channels of the second convolution (default 32)
	Kernel     int // odd square kernel of both convolutions (default 5), "same" padding
	Hidden     int // width of the hidden Linear layer (default 128)
	Classes    int // outputs (default 10)
}

func (c *CNNConfig) defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.InChannels, 1)
	def(&c.Size, 28)
	def(&c.Channels1, 16)
	def(&c.Channels2, 32)
	def(&c.Kernel, 5)
	def(&c.Hidden, 128)
	def(&c.Classes, 10)
}

// NewCNN returns a small convolutional network for Size×Size images as a
// Sequential; with the defaults it is, in PyTorch,
//
//	nn.Sequential(
//	    nn.Conv2d(1, 16, 5, padding=2),  # 0: 0.weight [16 1 5 5], 0.bias [16]
//	    nn.ReLU(),                       # 1
//	    nn.MaxPool2d(2),                 # 2
//	    nn.Conv2d(16, 32, 5, padding=2), # 3: 3.weight [32 16 5 5], 3.bias [32]
//	    nn.ReLU(),                       # 4
//	    nn.MaxPool2d(2),                 # 5
//	    nn.Flatten(),                    # 6
//	    nn.Linear(32*7*7, 128),          # 7: 7.weight [128 1568], 7.bias [128]
//	    nn.ReLU(),                       # 8
//	    nn.Linear(128, 10),              # 9: 9.weight [10 128], 9.bias [10]
//	)
//
// taking [N, 1, 28, 28] to [N, 10] logits: conv-ReLU-pool twice, then a
// hidden layer. Weights are drawn from rng (nil means the DefaultSeed
// generator) in layer order; the tensors are float32 unless opts add
// WithDtype(tensor.Float64). Each convolution or
// Linear followed by a ReLU is built with the bias and the ReLU in one pass
// (see Sequential.Forward), and each pool applies the preceding ReLU's
// derivative in its backward pass. At batch 64 in float32 a training step
// costs about 1.1 GFLOP, nearly all of it in GEMMs: BenchmarkCNNStep
// measures it.
func NewCNN(cfg CNNConfig, rng *rand.Rand, opts ...Option) (*Sequential, error) {
	cfg.defaults()
	if cfg.Size%4 != 0 || cfg.Kernel%2 == 0 || cfg.InChannels < 0 || cfg.Size < 0 || cfg.Kernel < 0 {
		return nil, fmt.Errorf("models: CNN needs an image size divisible by 4 and an odd kernel, got %+v: %w", cfg, errs.InvalidArgument)
	}
	if rng == nil {
		rng = newConfig(nil).rng
	}
	opts = append(append([]Option(nil), opts...), WithRand(rng))
	pad := cfg.Kernel / 2
	conv1, err := NewConv2d(cfg.InChannels, cfg.Channels1, cfg.Kernel, append(opts, WithPadding(pad, pad))...)
	if err != nil {
		return nil, err
	}
	pool1, err := NewMaxPool2d(2)
	if err != nil {
		return nil, err
	}
	conv2, err := NewConv2d(cfg.Channels1, cfg.Channels2, cfg.Kernel, append(opts, WithPadding(pad, pad))...)
	if err != nil {
		return nil, err
	}
	pool2, err := NewMaxPool2d(2)
	if err != nil {
		return nil, err
	}
	side := cfg.Size / 4
	fc1, err := NewLinear(cfg.Channels2*side*side, cfg.Hidden, opts...)
	if err != nil {
		return nil, err
	}
	fc2, err := NewLinear(cfg.Hidden, cfg.Classes, opts...)
	if err != nil {
		return nil, err
	}
	return NewSequential(conv1, ReLU{}, pool1, conv2, ReLU{}, pool2, Flatten{}, fc1, ReLU{}, fc2), nil
}
