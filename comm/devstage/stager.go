package devstage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/errs"
	"gorgonia.org/tensor"
)

// DefaultChunkBytes is the size of a staged chunk when WithChunkBytes is not
// given: large enough that a chunk's transfer dwarfs the per-collective
// overhead, small enough that the first copy to the host and the last back
// to the device, which nothing overlaps, stay short.
const DefaultChunkBytes = 4 << 20

// closeTimeout bounds Close's wait for copies that a failed collective left
// queued: the pinned buffers cannot be freed while a copy may still use them.
const closeTimeout = 30 * time.Second

// StepKind names a step of the staging pipeline, for WithTrace.
type StepKind uint8

// The steps of a chunk, in the order they happen to it.
const (
	// ToHostQueued: the chunk's copy from the device into pinned memory was
	// queued.
	ToHostQueued StepKind = iota + 1
	// ToHostDone: that copy was seen to have finished.
	ToHostDone
	// CollectiveStart: the chunk's collective was started on the pinned
	// memory.
	CollectiveStart
	// CollectiveDone: the chunk's collective finished.
	CollectiveDone
	// ToDeviceQueued: the chunk's copy from pinned memory back to the device
	// was queued.
	ToDeviceQueued
	// ToDeviceDone: that copy was seen to have finished.
	ToDeviceDone
)

var stepNames = [...]string{"", "to-host queued", "to-host done", "collective start", "collective done", "to-device queued", "to-device done"}

func (k StepKind) String() string {
	if int(k) < len(stepNames) && k > 0 {
		return stepNames[k]
	}
	return fmt.Sprintf("StepKind(%d)", uint8(k))
}

// Step is one step of the pipeline: its kind, the chunk's index in the
// buffer and the chunk's bytes.
type Step struct {
	Kind  StepKind
	Chunk int
	// Off is the chunk's byte offset in the buffer, Bytes its length.
	Off, Bytes int
}

// Option configures a Stager.
type Option func(*Stager) error

// WithChunkBytes sets the size of a staged chunk (DefaultChunkBytes by
// default), rounded down to a whole number of elements (at least one). Every
// rank of a group must use the same size: each chunk is one collective.
func WithChunkBytes(n int) Option {
	return func(s *Stager) error {
		if n <= 0 {
			return fmt.Errorf("devstage: chunk size %d bytes: want a positive size: %w", n, comm.ErrInvalidArgument)
		}
		s.chunk = n
		return nil
	}
}

// WithTrace has the Stager call fn at each step of the pipeline, on the
// goroutine running the collective (fn must be quick and must not call the
// Stager).
func WithTrace(fn func(Step)) Option {
	return func(s *Stager) error { s.trace = fn; return nil }
}

// Stager runs collectives on device buffers through pinned host memory, in
// chunks, overlapping the copies with the collectives (see the package doc).
// Its methods may be called from several goroutines; they run one at a time,
// since they share the two pinned buffers.
type Stager struct {
	dev   Device
	chunk int
	trace func(Step)

	sem     chan struct{}
	pinned  [2]Pinned
	size    int     // bytes of each pinned buffer
	pending []Fence // copies a failed collective left queued
	closed  bool
}

// New returns a Stager over dev. It allocates its pinned memory on first use.
func New(dev Device, opts ...Option) (*Stager, error) {
	if dev == nil {
		return nil, fmt.Errorf("devstage: new stager: nil device: %w", comm.ErrInvalidArgument)
	}
	s := &Stager{dev: dev, chunk: DefaultChunkBytes, sem: make(chan struct{}, 1)}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// AllReduce reduces buf across pg's ranks with op, in place: each chunk is
// copied to pinned memory, all-reduced there by pg, and copied back. Every
// rank passes a buffer of the same dtype and length (a mismatch fails with
// an error wrapping comm.ErrMismatch, as pg.AllReduce does). It returns when
// the result is in buf, or with the first error.
func (s *Stager) AllReduce(ctx context.Context, pg *comm.ProcessGroup, buf Buffer, op comm.ReduceOp) error {
	if pg == nil {
		return fmt.Errorf("devstage: all-reduce: nil process group: %w", comm.ErrInvalidArgument)
	}
	return s.run(ctx, "all-reduce", buf, true, true, func(ctx context.Context, t *tensor.Dense) error {
		return pg.AllReduce(ctx, t, op).Wait(ctx)
	})
}

// Broadcast copies root's buf into every other rank's buf (root is a rank
// of pg). Root's chunks only go to the host and others' only come back.
func (s *Stager) Broadcast(ctx context.Context, pg *comm.ProcessGroup, buf Buffer, root int) error {
	if pg == nil {
		return fmt.Errorf("devstage: broadcast: nil process group: %w", comm.ErrInvalidArgument)
	}
	if root < 0 || root >= pg.Size() {
		return fmt.Errorf("devstage: broadcast: root %d is not a rank of the group of %d: %w", root, pg.Size(), comm.ErrInvalidArgument)
	}
	isRoot := pg.Rank() == root
	return s.run(ctx, "broadcast", buf, isRoot, !isRoot, func(ctx context.Context, t *tensor.Dense) error {
		return pg.Broadcast(ctx, t, root).Wait(ctx)
	})
}

// Close frees the pinned memory, once the copies that a failed collective
// left queued have finished. If they do not finish within 30 seconds, it
// leaves the memory allocated (freeing memory that a copy may still use is
// worse than a leak) and says so.
func (s *Stager) Close() error {
	s.sem <- struct{}{}
	defer func() { <-s.sem }()
	if s.closed {
		return nil
	}
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := s.settle(ctx); err != nil {
		return fmt.Errorf("devstage: close: device copies still pending after %v; pinned memory not freed: %w", closeTimeout, err)
	}
	return s.free()
}

func (s *Stager) free() error {
	var errs []error
	for i, p := range s.pinned {
		if p != nil {
			if err := p.Free(); err != nil {
				errs = append(errs, fmt.Errorf("devstage: free pinned buffer %d: %w", i, err))
			}
			s.pinned[i] = nil
		}
	}
	s.size = 0
	return errors.Join(errs...)
}

func (s *Stager) note(k StepKind, chunk, off, n int) {
	if s.trace != nil {
		s.trace(Step{Kind: k, Chunk: chunk, Off: off, Bytes: n})
	}
}

// ensure makes both pinned buffers at least n bytes.
func (s *Stager) ensure(n int) error {
	if s.size >= n {
		return nil
	}
	if err := s.free(); err != nil {
		return err
	}
	for i := range s.pinned {
		p, err := s.dev.AllocPinned(n)
		if err != nil {
			_ = s.free()
			return fmt.Errorf("devstage: allocate %d bytes of pinned memory: %w", n, err)
		}
		if len(p.Bytes()) < n {
			_ = p.Free()
			_ = s.free()
			return fmt.Errorf("devstage: the device returned %d bytes of pinned memory for %d", len(p.Bytes()), n)
		}
		s.pinned[i] = p
	}
	s.size = n
	return nil
}

// run is the pipeline. With chunks c0, c1, ... alternating between pinned
// buffers p0 and p1, and one ordered device queue:
//
//	queue:     H(c0) H(c1)       D(c0) H(c2)       D(c1) H(c3) ...
//	host:            coll(c0)          coll(c1)          coll(c2) ...
//
// H(k+1) is queued before coll(k) starts, so the device copies chunk k+1
// while the group moves chunk k, and D(k) runs while the group moves chunk
// k+1. H(k+2) reuses the buffer that D(k) reads; it was queued after D(k),
// and the queue runs copies in order, so no wait is needed for that.
// Without the copy to the host (a broadcast's receivers), the collective
// writes the buffer itself, so it first waits for the copy that read it.
func (s *Stager) run(ctx context.Context, name string, buf Buffer, toHost, toDevice bool, coll func(context.Context, *tensor.Dense) error) (err error) {
	if buf == nil {
		return fmt.Errorf("devstage: %s: nil buffer: %w", name, comm.ErrInvalidArgument)
	}
	size, ok := elemSize(buf.Dtype())
	if !ok {
		return fmt.Errorf("devstage: %s: dtype %v is not one of float32, float64, int8, uint8, int32, int64: %w", name, buf.Dtype(), comm.ErrInvalidArgument)
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return errs.FromContext(ctx, "devstage: "+name+": wait for the stager's previous collective")
	}
	defer func() { <-s.sem }()
	if s.closed {
		return fmt.Errorf("devstage: %s: stager closed: %w", name, comm.ErrClosed)
	}
	if err := s.settle(ctx); err != nil {
		return fmt.Errorf("devstage: %s: wait for the copies of the previous, failed collective: %w", name, err)
	}
	total := buf.Len() * size
	if total == 0 {
		return nil
	}
	cb := max(s.chunk/size, 1) * size
	n := (total + cb - 1) / cb
	if err := s.ensure(min(cb, total)); err != nil {
		return fmt.Errorf("devstage: %s: %w", name, err)
	}
	chunk := func(k int) (off, nb int) { off = k * cb; return off, min(cb, total-off) }
	pin := [2][]byte{s.pinned[0].Bytes(), s.pinned[1].Bytes()}
	var toHostF, toDevF [2]Fence

	defer func() {
		if err != nil {
			// The copies still queued use the pinned buffers: the next
			// call, or Close, waits for them before touching the buffers,
			// and this one returns now.
			for _, f := range append(toHostF[:], toDevF[:]...) {
				if f != nil {
					s.pending = append(s.pending, f)
				}
			}
		}
	}()
	queueToHost := func(k int) error {
		off, nb := chunk(k)
		s.note(ToHostQueued, k, off, nb)
		f, err := s.dev.CopyToHost(pin[k%2][:nb], buf, off)
		if err != nil {
			return fmt.Errorf("devstage: %s: copy chunk %d of %d to the host: %w", name, k, n, err)
		}
		toHostF[k%2] = f
		return nil
	}
	if toHost {
		if err := queueToHost(0); err != nil {
			return err
		}
	}
	for k := 0; k < n; k++ {
		off, nb := chunk(k)
		b := k % 2
		if toHost && k+1 < n {
			if err := queueToHost(k + 1); err != nil {
				return err
			}
		}
		if toHost {
			if err := toHostF[b].Wait(ctx); err != nil {
				return fmt.Errorf("devstage: %s: chunk %d of %d to the host: %w", name, k, n, err)
			}
			toHostF[b] = nil
			s.note(ToHostDone, k, off, nb)
		}
		if f := toDevF[b]; f != nil {
			if err := f.Wait(ctx); err != nil {
				return fmt.Errorf("devstage: %s: chunk %d of %d to the device: %w", name, k-2, n, err)
			}
			toDevF[b] = nil
			po, pn := chunk(k - 2)
			s.note(ToDeviceDone, k-2, po, pn)
		}
		s.note(CollectiveStart, k, off, nb)
		if err := coll(ctx, view(pin[b][:nb], buf.Dtype())); err != nil {
			return fmt.Errorf("devstage: %s: chunk %d of %d (bytes %d-%d): %w", name, k, n, off, off+nb, err)
		}
		s.note(CollectiveDone, k, off, nb)
		if toDevice {
			s.note(ToDeviceQueued, k, off, nb)
			f, err := s.dev.CopyToDevice(buf, off, pin[b][:nb])
			if err != nil {
				return fmt.Errorf("devstage: %s: copy chunk %d of %d to the device: %w", name, k, n, err)
			}
			toDevF[b] = f
		}
	}
	for k := max(n-2, 0); k < n; k++ {
		if f := toDevF[k%2]; f != nil {
			if err := f.Wait(ctx); err != nil {
				return fmt.Errorf("devstage: %s: chunk %d of %d to the device: %w", name, k, n, err)
			}
			toDevF[k%2] = nil
			off, nb := chunk(k)
			s.note(ToDeviceDone, k, off, nb)
		}
	}
	return nil
}

// settle waits for the copies that a failed collective left queued, so that
// the pinned buffers can be written again.
func (s *Stager) settle(ctx context.Context) error {
	for len(s.pending) > 0 {
		if err := s.pending[0].Wait(ctx); err != nil {
			return err
		}
		s.pending = s.pending[1:]
	}
	return nil
}
