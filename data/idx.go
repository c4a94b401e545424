package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// IDX type codes and the magic numbers of MNIST-format files.
const (
	idxUbyte = 0x08
	// ImagesMagic starts an IDX file of images: unsigned bytes, 3 dimensions
	// (count, rows, columns).
	ImagesMagic = 0x00000803 // 2051
	// LabelsMagic starts an IDX file of labels: unsigned bytes, 1 dimension.
	LabelsMagic = 0x00000801 // 2049
	// MaxIDXBytes bounds the payload of an IDX file this package reads.
	MaxIDXBytes = 1 << 32
)

// IDX is the content of an IDX file of unsigned bytes (the format of MNIST
// and its relatives): its dimensions and its values in row-major order.
type IDX struct {
	Magic uint32
	Dims  []int
	Data  []byte
}

// ReadIDX reads one IDX file of unsigned bytes from r, decompressing it
// first if it starts with gzip's magic bytes. It checks the header (two zero
// bytes, type code 0x08, 1 to 4 dimensions, at most MaxIDXBytes values),
// that the payload is complete, and that nothing follows it. Malformed input
// is an error wrapping ErrInvalidArgument.
func ReadIDX(r io.Reader) (*IDX, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	head, err := br.Peek(2)
	if err != nil && len(head) < 2 {
		return nil, fmt.Errorf("data: IDX: file too short for a header: %w", ErrInvalidArgument)
	}
	var src io.Reader = br
	if head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("data: IDX: bad gzip header: %v: %w", err, ErrInvalidArgument)
		}
		defer zr.Close()
		zr.Multistream(false)
		src = bufio.NewReaderSize(zr, 1<<16)
	}
	var hdr [4]byte
	if _, err := io.ReadFull(src, hdr[:]); err != nil {
		return nil, fmt.Errorf("data: IDX: reading the magic number: %v: %w", err, ErrInvalidArgument)
	}
	magic := binary.BigEndian.Uint32(hdr[:])
	if hdr[0] != 0 || hdr[1] != 0 {
		return nil, fmt.Errorf("data: IDX: magic number %#08x does not start with two zero bytes (not an IDX file): %w", magic, ErrInvalidArgument)
	}
	if hdr[2] != idxUbyte {
		return nil, fmt.Errorf("data: IDX: type code %#02x; only unsigned bytes (0x08) are supported: %w", hdr[2], ErrInvalidArgument)
	}
	nd := int(hdr[3])
	if nd < 1 || nd > 4 {
		return nil, fmt.Errorf("data: IDX: %d dimensions (want 1 to 4): %w", nd, ErrInvalidArgument)
	}
	dimBytes := make([]byte, 4*nd)
	if _, err := io.ReadFull(src, dimBytes); err != nil {
		return nil, fmt.Errorf("data: IDX: reading %d dimensions: %v: %w", nd, err, ErrInvalidArgument)
	}
	dims := make([]int, nd)
	for i := range dims {
		dims[i] = int(binary.BigEndian.Uint32(dimBytes[4*i:]))
	}
	total := int64(1)
	for _, d := range dims {
		if d != 0 && total > MaxIDXBytes/int64(d) {
			return nil, fmt.Errorf("data: IDX: dimensions %v exceed %d values: %w", dims, int64(MaxIDXBytes), ErrInvalidArgument)
		}
		total *= int64(d)
	}
	// Grow the buffer as data arrives, so a header that lies about its size
	// cannot make us allocate memory the file does not back.
	buf := bytes.NewBuffer(make([]byte, 0, min(total, 4<<20)))
	if n, err := io.CopyN(buf, src, total); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("data: IDX: dimensions %v need %d bytes, the file holds %d: %w", dims, total, n, ErrInvalidArgument)
		}
		return nil, fmt.Errorf("data: IDX: reading %d bytes: %v: %w", total, err, ErrInvalidArgument)
	}
	var one [1]byte
	switch n, err := src.Read(one[:]); {
	case n > 0:
		return nil, fmt.Errorf("data: IDX: bytes follow the %d values of dimensions %v: %w", total, dims, ErrInvalidArgument)
	case err != nil && !errors.Is(err, io.EOF):
		return nil, fmt.Errorf("data: IDX: %v: %w", err, ErrInvalidArgument) // e.g. a gzip checksum error
	}
	return &IDX{Magic: magic, Dims: dims, Data: buf.Bytes()}, nil
}

// ReadIDXFile reads an IDX file (gzip or not) from path.
func ReadIDXFile(path string) (*IDX, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	x, err := ReadIDX(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return x, nil
}

// LoadIDX reads an MNIST-format pair of files, images (magic 2051,
// [n, rows, cols]) and labels (magic 2049, [n]), and returns them as an
// InMemory data set of float32 images of shape [1, rows, cols] with pixels
// scaled to [0, 1]. Options: Normalize(mean, std), Flatten.
func LoadIDX(imagesPath, labelsPath string, opts ...Option) (*InMemory, error) {
	images, err := ReadIDXFile(imagesPath)
	if err != nil {
		return nil, err
	}
	labels, err := ReadIDXFile(labelsPath)
	if err != nil {
		return nil, err
	}
	return NewIDXDataset(images, labels, opts...)
}

// NewIDXDataset turns decoded image and label files into a data set, as
// LoadIDX does.
func NewIDXDataset(images, labels *IDX, opts ...Option) (*InMemory, error) {
	var o options
	if err := o.apply("IDX data set", []string{"Normalize", "Flatten"}, opts); err != nil {
		return nil, err
	}
	if images == nil || labels == nil {
		return nil, fmt.Errorf("data: IDX data set: nil images or labels: %w", ErrInvalidArgument)
	}
	if images.Magic != ImagesMagic || len(images.Dims) != 3 {
		return nil, fmt.Errorf("data: images file has magic %d and dimensions %v, want magic %d and [n, rows, cols]: %w",
			images.Magic, images.Dims, ImagesMagic, ErrInvalidArgument)
	}
	if labels.Magic != LabelsMagic || len(labels.Dims) != 1 {
		return nil, fmt.Errorf("data: labels file has magic %d and dimensions %v, want magic %d and [n]: %w",
			labels.Magic, labels.Dims, LabelsMagic, ErrInvalidArgument)
	}
	n, rows, cols := images.Dims[0], images.Dims[1], images.Dims[2]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("data: %d images but %d labels: %w", n, labels.Dims[0], ErrInvalidArgument)
	}
	if rows == 0 || cols == 0 {
		return nil, fmt.Errorf("data: images of %dx%d pixels: %w", rows, cols, ErrInvalidArgument)
	}
	if o.set["Normalize"] && !(o.std > 0 || o.std < 0) {
		return nil, fmt.Errorf("data: Normalize with standard deviation %v: %w", o.std, ErrInvalidArgument)
	}
	x := make([]float32, len(images.Data))
	if o.set["Normalize"] {
		mean, std := o.mean, o.std
		for i, b := range images.Data {
			v := float32(b) / 255
			x[i] = (v - mean) / std
		}
	} else {
		for i, b := range images.Data {
			x[i] = float32(b) / 255
		}
	}
	y := make([]int, n)
	for i, b := range labels.Data {
		y[i] = int(b)
	}
	shape := []int{1, rows, cols}
	if o.flatten {
		shape = []int{rows * cols}
	}
	return NewInMemory(shape, x, y)
}
