package data

import (
	"fmt"
	"strings"
	"time"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/optset"
	"gorgonia.org/tensor"
)

// ErrInvalidArgument is wrapped by errors about bad arguments and malformed
// files.
var ErrInvalidArgument = errs.InvalidArgument

// Option configures a Loader, a sampler, or the loading of a data set. Each
// constructor names the options it takes and refuses the others, so that an
// option never silently does nothing.
type Option func(*options)

type options struct {
	shuffle    bool
	seed       uint64
	dropLast   bool
	prefetch   int
	workers    int
	sampler    Sampler
	dtype      tensor.Dtype
	mean, std  float32
	flatten    bool
	dir        string
	cacheDir   string
	noDownload bool
	mirrors    []string
	dlTimeout  time.Duration
	set        optset.Set
}

func (o *options) mark(name string) {
	o.set.Mark(name)
}

// Shuffle visits the examples in a random order drawn from seed and the
// epoch number (the same seed gives the same order on every rank and every
// run; another epoch gives another order). For a Loader without a sampler it
// turns shuffling on; for a DistributedSampler, which shuffles by default
// with seed 0, it sets the seed.
func Shuffle(seed uint64) Option {
	return func(o *options) { o.shuffle, o.seed = true, seed; o.mark("Shuffle") }
}

// NoShuffle keeps the data set's order (a DistributedSampler's default is to
// shuffle).
func NoShuffle() Option { return func(o *options) { o.shuffle = false; o.mark("NoShuffle") } }

// DropLast, for a Loader, drops the last batch of an epoch when it is smaller
// than the batch size; for a DistributedSampler, it trims the data set to a
// multiple of the number of replicas instead of padding it.
func DropLast() Option { return func(o *options) { o.dropLast = true; o.mark("DropLast") } }

// Prefetch sets how many batches a Loader prepares ahead of the consumer
// (default 2; at least 1).
func Prefetch(n int) Option { return func(o *options) { o.prefetch = n; o.mark("Prefetch") } }

// Workers sets how many goroutines assemble batches in parallel (default 1).
// Batches still arrive in order.
func Workers(n int) Option { return func(o *options) { o.workers = n; o.mark("Workers") } }

// WithSampler makes a Loader take each epoch's index order from s (for
// example a DistributedSampler). It excludes Shuffle, as in PyTorch.
func WithSampler(s Sampler) Option {
	return func(o *options) { o.sampler = s; o.mark("WithSampler") }
}

// Dtype sets the element type of a Loader's feature tensors: tensor.Float32
// (default) or tensor.Float64.
func Dtype(dt tensor.Dtype) Option { return func(o *options) { o.dtype = dt; o.mark("Dtype") } }

// Normalize maps every pixel, after scaling it to [0, 1], to (x-mean)/std in
// float32, as torchvision's ToTensor followed by Normalize((mean,), (std,))
// does. Without it pixels are x/255.
func Normalize(mean, std float32) Option {
	return func(o *options) { o.mean, o.std = mean, std; o.mark("Normalize") }
}

// Flatten gives images the shape [rows*cols] instead of [1, rows, cols].
func Flatten() Option { return func(o *options) { o.flatten = true; o.mark("Flatten") } }

// Dir makes FashionMNIST look for its files in dir only (and download into
// dir when they are missing and downloads are allowed).
func Dir(dir string) Option { return func(o *options) { o.dir = dir; o.mark("Dir") } }

// CacheDir sets where FashionMNIST keeps downloaded files (default
// <user cache dir>/tandem/fashion-mnist).
func CacheDir(dir string) Option { return func(o *options) { o.cacheDir = dir; o.mark("CacheDir") } }

// NoDownload stops FashionMNIST from downloading missing files.
func NoDownload() Option { return func(o *options) { o.noDownload = true; o.mark("NoDownload") } }

// DownloadFrom replaces the mirrors FashionMNIST downloads from: each base URL
// is tried in turn, with the file name appended after a slash.
func DownloadFrom(baseURLs ...string) Option {
	return func(o *options) { o.mirrors = append([]string(nil), baseURLs...); o.mark("DownloadFrom") }
}

// DownloadTimeout bounds a whole download attempt (default 2 minutes; the
// connection itself must open within 10 seconds).
func DownloadTimeout(d time.Duration) Option {
	return func(o *options) { o.dlTimeout = d; o.mark("DownloadTimeout") }
}

// apply runs opts over o, refusing options outside allowed.
func (o *options) apply(what string, allowed []string, opts []Option) error {
	for _, f := range opts {
		if f == nil {
			return fmt.Errorf("data: %s: nil option: %w", what, ErrInvalidArgument)
		}
		f(o)
	}
	if foreign := o.set.Foreign(allowed); len(foreign) > 0 {
		return fmt.Errorf("data: %s does not take the option(s) %s (it takes %s): %w",
			what, strings.Join(foreign, ", "), strings.Join(allowed, ", "), ErrInvalidArgument)
	}
	return nil
}
