package devstage_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/devstage"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"
)

// rankValue is rank r's element i: small integers, so that sums and
// averages are exact in every dtype and every order of reduction.
func rankValue(r, i int) float64 { return float64((i*7+r*13)%23 - 11) }

func makeTensor(dt tensor.Dtype, n int, f func(i int) float64) *tensor.Dense {
	switch dt {
	case tensor.Float32:
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(f(i))
		}
		return tensor.New(tensor.WithShape(n), tensor.WithBacking(s))
	case tensor.Float64:
		s := make([]float64, n)
		for i := range s {
			s[i] = f(i)
		}
		return tensor.New(tensor.WithShape(n), tensor.WithBacking(s))
	case tensor.Int64:
		s := make([]int64, n)
		for i := range s {
			s[i] = int64(f(i))
		}
		return tensor.New(tensor.WithShape(n), tensor.WithBacking(s))
	case tensor.Int8:
		s := make([]int8, n)
		for i := range s {
			s[i] = int8(f(i))
		}
		return tensor.New(tensor.WithShape(n), tensor.WithBacking(s))
	}
	panic("makeTensor: dtype " + dt.String())
}

func element(t *tensor.Dense, i int) float64 {
	switch d := t.Data().(type) {
	case []float32:
		return float64(d[i])
	case []float64:
		return d[i]
	case []int64:
		return float64(d[i])
	case []int8:
		return float64(d[i])
	}
	panic(fmt.Sprintf("element: %T", t.Data()))
}

func localGroups(t *testing.T, n int) []*comm.ProcessGroup {
	t.Helper()
	pgs, err := local.NewGroups(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, pg := range pgs {
			pg.Close()
		}
	})
	return pgs
}

func newStager(t *testing.T, dev devstage.Device, opts ...devstage.Option) *devstage.Stager {
	t.Helper()
	s, err := devstage.New(dev, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close stager: %v", err)
		}
	})
	return s
}

func newHost(t *testing.T, opts ...devstage.HostOption) *devstage.Host {
	t.Helper()
	h := devstage.NewHost(opts...)
	t.Cleanup(func() { h.Close() })
	return h
}

func hostBuffer(t *testing.T, x *tensor.Dense) *devstage.HostBuffer {
	t.Helper()
	b, err := devstage.NewHostBuffer(x)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkAllReduce stages an all-reduce of n elements of dt across the
// groups, in chunks of chunk bytes, and compares every rank's result with
// the exact one.
func checkAllReduce(t *testing.T, pgs []*comm.ProcessGroup, dt tensor.Dtype, n, chunk int, op comm.ReduceOp) {
	t.Helper()
	size := len(pgs)
	want := make([]float64, n)
	for i := range want {
		for r := 0; r < size; r++ {
			v := rankValue(r, i)
			switch {
			case op.Kind() == comm.KindMax && r > 0:
				want[i] = max(want[i], v)
			case r == 0:
				want[i] = v
			default:
				want[i] += v
			}
		}
		if op.Kind() == comm.KindAvg {
			want[i] /= float64(size)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	testkit.RequireEachRank(t, size, func(r int) error {
		x := makeTensor(dt, n, func(i int) float64 { return rankValue(r, i) })
		s := newStager(t, newHost(t), devstage.WithChunkBytes(chunk))
		if err := s.AllReduce(ctx, pgs[r], hostBuffer(t, x), op); err != nil {
			return err
		}
		for i := range want {
			if got := element(x, i); got != want[i] {
				return fmt.Errorf("element %d of %d: got %v, want %v", i, n, got, want[i])
			}
		}
		return nil
	})
}

func TestAllReduceLocal(t *testing.T) {
	pgs := localGroups(t, 3)
	for _, tc := range []struct {
		dt       tensor.Dtype
		n, chunk int
		op       comm.ReduceOp
	}{
		{tensor.Float32, 1, 64, comm.Sum},
		{tensor.Float32, 16, 64, comm.Sum},     // one whole chunk
		{tensor.Float32, 1000, 64, comm.Sum},   // 63 chunks, the last one short
		{tensor.Float32, 1000, 4096, comm.Max}, // one chunk larger than needed
		{tensor.Float64, 257, 80, comm.Avg},    // chunk of 10 elements
		{tensor.Float64, 300, 2, comm.Sum},     // chunk rounded up to one element
		{tensor.Int64, 999, 128, comm.Sum},     // odd count, int
		{tensor.Int8, 1001, 100, comm.Max},     // byte elements
		{tensor.Float32, 1 << 16, 1 << 12, comm.Sum},
	} {
		t.Run(fmt.Sprintf("%v/n=%d/chunk=%d/%v", tc.dt, tc.n, tc.chunk, tc.op.Kind()), func(t *testing.T) {
			checkAllReduce(t, pgs, tc.dt, tc.n, tc.chunk, tc.op)
		})
	}
}

func TestAllReduceTCP(t *testing.T) {
	pgs := commtest.Connect(tcp.NewBackend(tcp.WithHost("127.0.0.1")))(t, 2)
	t.Cleanup(func() {
		for _, pg := range pgs {
			pg.Close()
		}
	})
	checkAllReduce(t, pgs, tensor.Float32, 100000, 1<<14, comm.Sum)
	checkAllReduce(t, pgs, tensor.Float64, 5000, 1<<10, comm.Avg)
}

func TestBroadcast(t *testing.T) {
	pgs := localGroups(t, 3)
	const n, root = 777, 1
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	testkit.RequireEachRank(t, 3, func(r int) error {
		x := makeTensor(tensor.Float64, n, func(i int) float64 { return rankValue(r, i) })
		var steps []devstage.Step
		s := newStager(t, newHost(t), devstage.WithChunkBytes(256), devstage.WithTrace(func(st devstage.Step) { steps = append(steps, st) }))
		if err := s.Broadcast(ctx, pgs[r], hostBuffer(t, x), root); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if got, want := element(x, i), rankValue(root, i); got != want {
				return fmt.Errorf("element %d: got %v, want root's %v", i, got, want)
			}
		}
		// The root only copies to the host, the others only to the device.
		for _, st := range steps {
			toHost := st.Kind == devstage.ToHostQueued || st.Kind == devstage.ToHostDone
			toDev := st.Kind == devstage.ToDeviceQueued || st.Kind == devstage.ToDeviceDone
			if (r == root && toDev) || (r != root && toHost) {
				return fmt.Errorf("rank %d (root %d) made a step %v of chunk %d", r, root, st.Kind, st.Chunk)
			}
		}
		return nil
	})
}

// TestPipelineOrder checks the order of the pipeline's steps and of the
// device queue on every rank: chunk k+1's copy to the host is queued before
// chunk k's collective starts, each collective starts on a chunk that has
// arrived, each result goes back after its collective, and a pinned buffer
// is refilled only after the copy that reads it was queued ahead.
func TestPipelineOrder(t *testing.T) {
	const size, n, chunkBytes = 2, 1000, 400 // 10 chunks of 100 float32
	const chunks = n * 4 / chunkBytes
	pgs := localGroups(t, size)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	testkit.RequireEachRank(t, size, func(r int) error {
		var mu sync.Mutex
		var steps []devstage.Step
		var copies []devstage.Copy
		dev := newHost(t, devstage.HostCopyHook(func(c devstage.Copy) {
			mu.Lock()
			copies = append(copies, c)
			mu.Unlock()
		}))
		s := newStager(t, dev, devstage.WithChunkBytes(chunkBytes), devstage.WithTrace(func(st devstage.Step) {
			mu.Lock()
			steps = append(steps, st)
			mu.Unlock()
		}))
		x := makeTensor(tensor.Float32, n, func(i int) float64 { return rankValue(r, i) })
		if err := s.AllReduce(ctx, pgs[r], hostBuffer(t, x), comm.Sum); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		at := map[devstage.StepKind][]int{}
		for i, st := range steps {
			if st.Off != st.Chunk*chunkBytes || st.Bytes != chunkBytes {
				return fmt.Errorf("step %d: %+v: want bytes [%d,%d)", i, st, st.Chunk*chunkBytes, (st.Chunk+1)*chunkBytes)
			}
			if len(at[st.Kind]) != st.Chunk {
				return fmt.Errorf("step %d: %v of chunk %d after %d such steps", i, st.Kind, st.Chunk, len(at[st.Kind]))
			}
			at[st.Kind] = append(at[st.Kind], i)
		}
		for kind := devstage.ToHostQueued; kind <= devstage.ToDeviceDone; kind++ {
			if len(at[kind]) != chunks {
				return fmt.Errorf("%d steps %v, want one per chunk (%d)", len(at[kind]), kind, chunks)
			}
		}
		before := func(a devstage.StepKind, ka int, b devstage.StepKind, kb int) error {
			if at[a][ka] >= at[b][kb] {
				return fmt.Errorf("%v of chunk %d (step %d) came after %v of chunk %d (step %d); steps: %v", a, ka, at[a][ka], b, kb, at[b][kb], steps)
			}
			return nil
		}
		for k := 0; k < chunks; k++ {
			for _, err := range []error{
				before(devstage.ToHostDone, k, devstage.CollectiveStart, k),
				before(devstage.CollectiveDone, k, devstage.ToDeviceQueued, k),
			} {
				if err != nil {
					return err
				}
			}
			if k+1 < chunks {
				if err := before(devstage.ToHostQueued, k+1, devstage.CollectiveStart, k); err != nil {
					return err
				}
			}
			if k+2 < chunks {
				if err := before(devstage.ToDeviceQueued, k, devstage.ToHostQueued, k+2); err != nil {
					return err
				}
			}
		}
		// The device ran the copies in the order queued: H0 H1 D0 H2 D1 H3 ...
		want := []devstage.Copy{{Seq: 0, Off: 0, Bytes: chunkBytes}}
		for k := 0; k < chunks; k++ {
			if k+1 < chunks {
				want = append(want, devstage.Copy{Seq: len(want), Off: (k + 1) * chunkBytes, Bytes: chunkBytes})
			}
			want = append(want, devstage.Copy{Seq: len(want), ToDevice: true, Off: k * chunkBytes, Bytes: chunkBytes})
		}
		if fmt.Sprint(copies) != fmt.Sprint(want) {
			return fmt.Errorf("device queue ran\n%v\nwant\n%v", copies, want)
		}
		return nil
	})
}

// TestCopiesOverlapCollectives makes each overlap the pipeline promises
// happen, or hang: when chunk k's collective starts, the device must already
// be in the middle of copying chunk k+1 to the host and chunk k-1 back to
// the device, and those copies are held until that collective has started.
// A pipeline that waited for either copy before starting the collective (or
// queued them after it) would never get past the start, and the test fails
// at its deadline.
func TestCopiesOverlapCollectives(t *testing.T) {
	const size, chunkBytes, chunks = 3, 256, 12
	pgs := localGroups(t, size)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	testkit.RequireEachRank(t, size, func(r int) error {
		mk := func() []chan struct{} {
			cs := make([]chan struct{}, chunks)
			for k := range cs {
				cs[k] = make(chan struct{})
			}
			return cs
		}
		started, hostBusy, devBusy := mk(), mk(), mk()
		var overlapped int
		dev := newHost(t, devstage.HostCopyHook(func(c devstage.Copy) {
			k := c.Off / chunkBytes
			var gate int // the collective this copy must overlap
			switch {
			case !c.ToDevice && k > 0:
				gate = k - 1
				close(hostBusy[k])
			case c.ToDevice && k+1 < chunks:
				gate = k + 1
				close(devBusy[k])
			default:
				return
			}
			select {
			case <-started[gate]:
				overlapped++
			case <-ctx.Done():
			}
		}))
		var traceErr error
		s := newStager(t, dev, devstage.WithChunkBytes(chunkBytes), devstage.WithTrace(func(st devstage.Step) {
			if st.Kind != devstage.CollectiveStart {
				return
			}
			k := st.Chunk
			close(started[k])
			wait := func(c chan struct{}, what string) {
				select {
				case <-c:
				case <-ctx.Done():
					if traceErr == nil {
						traceErr = fmt.Errorf("collective %d started without the device copying %s", k, what)
					}
				}
			}
			if k+1 < chunks {
				wait(hostBusy[k+1], fmt.Sprintf("chunk %d to the host", k+1))
			}
			if k > 0 {
				wait(devBusy[k-1], fmt.Sprintf("chunk %d to the device", k-1))
			}
		}))
		x := makeTensor(tensor.Float32, chunks*chunkBytes/4, func(i int) float64 { return rankValue(r, i) })
		if err := s.AllReduce(ctx, pgs[r], hostBuffer(t, x), comm.Sum); err != nil {
			return errors.Join(traceErr, err)
		}
		if traceErr != nil {
			return traceErr
		}
		// The fences were waited on, so the hook's count is settled.
		if want := 2 * (chunks - 1); overlapped != want {
			return fmt.Errorf("%d copies overlapped a collective, want %d", overlapped, want)
		}
		for i := 0; i < chunks*chunkBytes/4; i++ {
			var want float64
			for q := 0; q < size; q++ {
				want += rankValue(q, i)
			}
			if got := element(x, i); got != want {
				return fmt.Errorf("element %d: got %v, want %v", i, got, want)
			}
		}
		return nil
	})
}

func TestMismatchedLengths(t *testing.T) {
	pgs := localGroups(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 25 and 24 float32 in chunks of 10: chunks 0 and 1 agree, the
			// third has 5 elements on rank 0 and 4 on rank 1.
			x := makeTensor(tensor.Float32, 25-r, func(i int) float64 { return 1 })
			s := newStager(t, newHost(t), devstage.WithChunkBytes(40))
			errs[r] = s.AllReduce(ctx, pgs[r], hostBuffer(t, x), comm.Sum)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: got %v, want an error wrapping comm.ErrMismatch", r, err)
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	pgs := localGroups(t, 1)
	ctx := context.Background()
	if _, err := devstage.New(nil); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("New(nil): got %v", err)
	}
	if _, err := devstage.New(newHost(t), devstage.WithChunkBytes(0)); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("chunk 0: got %v", err)
	}
	if _, err := devstage.NewHostBuffer(tensor.New(tensor.WithShape(2), tensor.WithBacking([]complex64{1, 2}))); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("complex64 buffer: got %v", err)
	}
	s := newStager(t, newHost(t))
	if err := s.AllReduce(ctx, pgs[0], foreign{}, comm.Sum); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("a buffer of another device: got %v", err)
	}
	b := hostBuffer(t, makeTensor(tensor.Float32, 4, func(int) float64 { return 1 }))
	if err := s.Broadcast(ctx, pgs[0], b, 1); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("broadcast from root 1 of 1: got %v", err)
	}
	if err := s.AllReduce(ctx, nil, b, comm.Sum); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("nil group: got %v", err)
	}
	// The stager is still usable after refusals.
	if err := s.AllReduce(ctx, pgs[0], b, comm.Sum); err != nil {
		t.Errorf("all-reduce over one rank: %v", err)
	}
	s.Close()
	if err := s.AllReduce(ctx, pgs[0], b, comm.Sum); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("after Close: got %v", err)
	}
}

type foreign struct{}

func (foreign) Dtype() tensor.Dtype { return tensor.Float32 }
func (foreign) Len() int            { return 4 }

// TestCancelWhileCopying cancels a staged all-reduce while the device holds
// its first copy: the call returns the context's error at once, the next
// call fails for its own context while that copy is still held (it must not
// touch the pinned memory under it), and once the copy is let go the next
// call waits for it and works.
func TestCancelWhileCopying(t *testing.T) {
	pgs := localGroups(t, 1)
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()
	entered := make(chan struct{}, 16)
	var hold sync.Once
	dev := newHost(t, devstage.HostCopyHook(func(c devstage.Copy) {
		hold.Do(func() {
			entered <- struct{}{}
			<-release
		})
	}))
	s := newStager(t, dev, devstage.WithChunkBytes(64))
	x := makeTensor(tensor.Float32, 100, func(i int) float64 { return float64(i) })
	b := hostBuffer(t, x)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.AllReduce(ctx, pgs[0], b, comm.Sum) }()
	<-entered
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("all-reduce did not return after its context was canceled")
	}
	if errors.Is(err, comm.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want an error wrapping context.Canceled and not comm.ErrTimeout", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if err := s.AllReduce(short, pgs[0], b, comm.Sum); !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("all-reduce while the failed one's copy is held: got %v, want an error wrapping comm.ErrTimeout", err)
	}
	releaseOnce()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := s.AllReduce(ctx2, pgs[0], b, comm.Sum); err != nil {
		t.Fatalf("all-reduce after the canceled one: %v", err)
	}
	for i := 0; i < 100; i++ {
		if got := element(x, i); got != float64(i) {
			t.Fatalf("element %d: got %v after a one-rank sum, want %v", i, got, i)
		}
	}
}
