package comm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"gorgonia.org/tensor"
)

func TestReduceKernels(t *testing.T) {
	a := []int8{-128, 127, 5, -3}
	b := []int8{-1, 1, 3, -3}
	cases := []struct {
		k    ReduceKind
		want []int8
	}{
		{KindSum, []int8{127, -128, 8, -6}}, // wraps
		{KindProduct, []int8{-128, 127, 15, 9}},
		{KindMin, []int8{-128, 1, 3, -3}},
		{KindMax, []int8{-1, 127, 5, -3}},
		{KindBAnd, []int8{-128, 1, 1, -3}},
		{KindBOr, []int8{-1, 127, 7, -3}},
		{KindBXor, []int8{127, 126, 6, 0}},
	}
	for _, c := range cases {
		dst := append([]int8(nil), a...)
		reduceInto(asBytes(dst), asBytes(b), dtInt8, c.k)
		for i := range dst {
			if dst[i] != c.want[i] {
				t.Errorf("%v: got %v, want %v", c.k, dst, c.want)
				break
			}
		}
	}
	f := []float32{1, float32(math.NaN()), float32(math.Copysign(0, -1)), 2}
	g := []float32{2, 1, 0, float32(math.Inf(1))}
	reduceInto(asBytes(f), asBytes(g), dtFloat32, KindMax)
	if f[0] != 2 || !math.IsNaN(float64(f[1])) || f[3] != float32(math.Inf(1)) {
		t.Errorf("float max: got %v (NaN must propagate)", f)
	}
}

func TestDivideAndScale(t *testing.T) {
	x := []int32{-7, 7, -1, 0}
	divideBuf(asBytes(x), dtInt32, 2)
	if fmt.Sprint(x) != "[-3 3 0 0]" {
		t.Errorf("integer average truncates toward zero: got %v", x)
	}
	y := []int8{-128, 127}
	divideBuf(asBytes(y), dtInt8, 200) // a world larger than int8's range
	if fmt.Sprint(y) != "[0 0]" {
		t.Errorf("int8 divided by 200: got %v", y)
	}
	u := []uint8{250}
	divideBuf(asBytes(u), dtUint8, 300)
	if u[0] != 0 {
		t.Errorf("uint8 divided by 300: got %v", u)
	}
	z := []float64{1, -2}
	scaleBuf(asBytes(z), dtFloat64, 0.5)
	if z[0] != 0.5 || z[1] != -1 {
		t.Errorf("scale: got %v", z)
	}
	w := []int64{3}
	scaleBuf(asBytes(w), dtInt64, -2)
	if w[0] != -6 {
		t.Errorf("integer scale: got %v", w)
	}
}

func TestReduceOpNames(t *testing.T) {
	if Sum.String() != "sum" || PremulSum(0.25).String() != "premul_sum(0.25)" || BXor.Kind() != KindBXor {
		t.Errorf("names: %v %v %v", Sum, PremulSum(0.25), BXor.Kind())
	}
	if PremulSum(2).Factor() != 2 {
		t.Error("factor")
	}
	for _, c := range []struct {
		op ReduceOp
		dt dtype
		ok bool
	}{
		{Sum, dtFloat32, true}, {BAnd, dtFloat64, false}, {BAnd, dtInt8, true},
		{PremulSum(0.5), dtInt32, false}, {PremulSum(2), dtInt32, true},
		{PremulSum(math.Inf(1)), dtFloat32, false}, {ReduceOp{}, dtInt64, false},
	} {
		err := c.op.checkFor(c.dt)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("%v on %v: got %v", c.op, c.dt, err)
		}
	}
}

func TestFingerprintFrames(t *testing.T) {
	op := collective{desc: "all_reduce(float32,[4],sum)"}
	f := encodeFingerprint(3, op)
	if len(f) != fingerprintSize || fingerprintDesc(f) != op.desc {
		t.Fatalf("round trip: %q", fingerprintDesc(f))
	}
	// Long descriptions are cut, but two that differ only past the cut
	// still give different frames.
	long := strings.Repeat("x", 400)
	a := encodeFingerprint(1, collective{desc: long + "a"})
	b := encodeFingerprint(1, collective{desc: long + "b"})
	if string(a) == string(b) {
		t.Error("descriptions differing past the cut give equal frames")
	}
	if !strings.Contains(fingerprintDesc(a), "...#") {
		t.Errorf("cut description shows no hash: %q", fingerprintDesc(a))
	}
	bad := encodeFingerprint(1, collective{desc: op.desc, invalid: errors.New("nope")})
	if string(bad) == string(f) || !strings.Contains(fingerprintDesc(bad), "nope") {
		t.Errorf("invalid arguments are not visible in the frame: %q", fingerprintDesc(bad))
	}
}

func TestTreeLinks(t *testing.T) {
	for n := 1; n <= 17; n++ {
		for root := range n {
			reached := map[int]int{root: 0}
			for r := range n {
				parent, children := treeLinks(n, r, root)
				if (parent < 0) != (r == root) {
					t.Fatalf("n=%d root=%d: rank %d parent %d", n, root, r, parent)
				}
				for _, c := range children {
					if p, _ := treeLinks(n, c, root); p != r {
						t.Fatalf("n=%d root=%d: %d lists child %d whose parent is %d", n, root, r, c, p)
					}
					reached[c]++
				}
			}
			if len(reached) != n {
				t.Fatalf("n=%d root=%d: tree reaches %d ranks", n, root, len(reached))
			}
			for r, k := range reached {
				if r != root && k != 1 {
					t.Fatalf("n=%d root=%d: rank %d has %d parents", n, root, r, k)
				}
			}
		}
	}
}

func TestSplitEven(t *testing.T) {
	b := make([]byte, 4*10)
	segs := splitEven(b, 4, 3)
	total := 0
	for _, s := range segs {
		if n := len(s) / 4; n < 3 || n > 4 {
			t.Errorf("segment of %d elements", n)
		}
		total += len(s)
	}
	if total != len(b) {
		t.Errorf("segments cover %d of %d bytes", total, len(b))
	}
}

func TestTags(t *testing.T) {
	seen := map[transport.Tag]string{}
	add := func(tag transport.Tag, what string) {
		if prev, dup := seen[tag]; dup {
			t.Fatalf("%s and %s share tag %#x", prev, what, uint64(tag))
		}
		seen[tag] = what
	}
	for gid := range uint32(3) {
		for seq := range uint32(3) {
			for _, step := range []uint16{0, 1, stepFinger, stepMonitor} {
				add(collectiveTag(gid, seq, step), fmt.Sprintf("coll g%d s%d st%d", gid, seq, step))
			}
		}
		for _, tag := range []int{0, 1, maxUserTag} {
			add(p2pTag(gid, tag), fmt.Sprintf("p2p g%d t%d", gid, tag))
		}
	}
}

type nopBackend struct{}

func (nopBackend) Connect(context.Context, transport.Config) (transport.Transport, error) {
	return nil, errors.New("nop")
}

func TestRegistry(t *testing.T) {
	// A name of its own each run, so that -count=N registers afresh.
	name := fmt.Sprintf("test-nop-%d", registryRuns.Add(1))
	Register(name, nopBackend{})
	if b, err := Lookup(name); err != nil || b == nil {
		t.Fatalf("Lookup: %v %v", b, err)
	}
	_, err := Lookup("no-such-backend")
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), name) {
		t.Errorf("unknown backend: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("registering a name twice did not panic")
		}
	}()
	Register(name, nopBackend{})
}

var registryRuns atomic.Int64

func TestWork(t *testing.T) {
	w := newWork("thing")
	if w.Err() != nil {
		t.Error("Err before done")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := w.Wait(ctx); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on expired context: %v", err)
	}
	boom := errors.New("boom")
	w.finish(boom)
	if err := w.Wait(ctx); err != boom || w.Err() != boom {
		t.Errorf("finished work: %v %v", err, w.Err())
	}
	j := joinWork("both", []*work{failedWork("a", nil), failedWork("b", boom)})
	if err := j.Wait(context.Background()); err != boom {
		t.Errorf("joined work: %v", err)
	}
}

func TestTensorBuffer(t *testing.T) {
	x := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{0, 1, 2, 3, 4, 5}))
	b, err := tensorBuffer(x, "x")
	if err != nil || len(b.b) != 48 || b.dt != dtFloat64 {
		t.Fatalf("contiguous tensor: %v %v", b, err)
	}
	// The bytes alias the tensor: no copy.
	typed[float64](b.b)[0] = 42
	if x.Data().([]float64)[0] != 42 {
		t.Error("buffer does not alias the tensor")
	}
	if err := x.T(); err != nil {
		t.Fatal(err)
	}
	if _, err := tensorBuffer(x, "x"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("transposed view: got %v, want ErrInvalidArgument", err)
	}
	if _, err := tensorBuffer(nil, "x"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil: got %v", err)
	}
	empty := tensor.New(tensor.Of(tensor.Int32), tensor.WithShape(0))
	if b, err := tensorBuffer(empty, "e"); err != nil || len(b.b) != 0 {
		t.Errorf("empty tensor: %v %v", b, err)
	}
}
