package models

import (
	"errors"
	"fmt"
	"hash"
	"sync"

	"github.com/chewxy/hm"
	"gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	tblas "github.com/tandemml/tandem/internal/blas"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/opkit"
)

// Conv2d's ops. The forward pass of sample n is one GEMM,
//
//	y[n] (O×P) = W (O×CK) · col(x[n]) (CK×P)
//
// where P = OH·OW output positions, CK = C·kh·kw, and col(x[n]) is the
// im2col matrix whose row (c, u, v) holds, for every output position, the
// input pixel that kernel tap (u, v) of channel c sees there (0 in the
// padding). The gradients are GEMMs over the same matrices:
//
//	dW = Σ_n dy[n] · col(x[n])ᵀ           (accumulated by GEMM's beta)
//	dx[n] = col2im(Wᵀ · dy[n])              (col2im adds each entry back
//	                                          into the pixel it came from)
//
// so they are exact sums of products, like the direct definition. A
// 1×1 kernel with stride 1 and no padding needs no im2col: col(x[n]) is
// x[n] itself. The im2col matrix of one sample is built in a scratch buffer
// reused across samples and runs.

// convGeom is the geometry of one convolution.
type convGeom struct {
	n, c, h, w     int // input [N, C, H, W]
	o, oh, ow      int // output [N, O, OH, OW]
	kh, kw         int
	sh, sw, ph, pw int
	dh, dw         int
}

func (g convGeom) ck() int { return g.c * g.kh * g.kw }
func (g convGeom) p() int  { return g.oh * g.ow }

// direct reports whether col(x[n]) is x[n] itself.
func (g convGeom) direct() bool {
	return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0
}

// convParams are a convolution's kernel, stride, padding and dilation.
type convParams struct {
	k, s, p, d [2]int
}

func (cp convParams) String() string {
	return fmt.Sprintf("k:%v,s:%v,p:%v,d:%v", cp.k, cp.s, cp.p, cp.d)
}

// outHW returns the output height and width for an H×W input; ok is false
// when the dilated kernel does not fit the padded input.
func (cp convParams) outHW(h, w int) (oh, ow int, ok bool) {
	eh := cp.d[0]*(cp.k[0]-1) + 1
	ew := cp.d[1]*(cp.k[1]-1) + 1
	if h+2*cp.p[0] < eh || w+2*cp.p[1] < ew {
		return 0, 0, false
	}
	return (h+2*cp.p[0]-eh)/cp.s[0] + 1, (w+2*cp.p[1]-ew)/cp.s[1] + 1, true
}

func (cp convParams) geom(x tensor.Shape, o int) (convGeom, error) {
	if len(x) != 4 {
		return convGeom{}, fmt.Errorf("models: Conv2d needs an NCHW input, got shape %v: %w", x, errs.InvalidArgument)
	}
	oh, ow, ok := cp.outHW(x[2], x[3])
	if !ok {
		return convGeom{}, fmt.Errorf("models: Conv2d kernel %v (dilation %v) larger than the padded input %v: %w", cp.k, cp.d, x, errs.InvalidArgument)
	}
	return convGeom{n: x[0], c: x[1], h: x[2], w: x[3], o: o, oh: oh, ow: ow,
		kh: cp.k[0], kw: cp.k[1], sh: cp.s[0], sw: cp.s[1], ph: cp.p[0], pw: cp.p[1], dh: cp.d[0], dw: cp.d[1]}, nil
}

// scratch keeps an op's work buffers (im2col matrices, padded samples)
// from one run to the next. Unlike a sync.Pool it survives garbage
// collections, so a training step allocates nothing once warm.
type scratch struct {
	mu   sync.Mutex
	free []any // *[]T of the dtypes the op has run in
}

// maxScratch bounds the buffers one op keeps (it uses at most four at once).
const maxScratch = 8

// getScratch returns a slice of n elements (contents undefined) and the
// function that gives it back to s.
func getScratch[T float](s *scratch, n int) ([]T, func()) {
	if s == nil {
		return make([]T, n), func() {}
	}
	s.mu.Lock()
	for i := len(s.free) - 1; i >= 0; i-- {
		if p, ok := s.free[i].(*[]T); ok && cap(*p) >= n {
			s.free = append(s.free[:i], s.free[i+1:]...)
			s.mu.Unlock()
			return (*p)[:n], func() { s.put(p) }
		}
	}
	s.mu.Unlock()
	buf := make([]T, n)
	return buf, func() { s.put(&buf) }
}

func (s *scratch) put(p any) {
	s.mu.Lock()
	if len(s.free) < maxScratch {
		s.free = append(s.free, p)
	}
	s.mu.Unlock()
}

// gemmFunc is tblas.Sgemm or tblas.Dgemm.
type gemmFunc[T float] func(tA, tB blas.Transpose, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)

// validRange returns the output columns j in [0, n) whose input column
// j·s + off lies in [0, w).
func validRange(n, s, off, w int) (j0, j1 int) {
	if off < 0 {
		j0 = (-off + s - 1) / s
	}
	if w-1-off < 0 {
		return 0, 0
	}
	j1 = min(n, (w-1-off)/s+1)
	if j0 > j1 {
		j0 = j1
	}
	return j0, j1
}

// eachTap calls f for each row (c, u, v) of a column matrix (CK×P) over
// one sample's image (C×H×W): the row, the plane of channel c, the kernel
// row u, the tap's column offset off and the output columns [j0, j1) that
// read inside the image (see validRange). im2col and col2im walk the column
// matrix this way, in the same order.
func eachTap[T float](g convGeom, col, img []T, f func(row, plane []T, u, off, j0, j1 int)) {
	p := g.p()
	row := 0
	for c := 0; c < g.c; c++ {
		plane := img[c*g.h*g.w : (c+1)*g.h*g.w]
		for u := 0; u < g.kh; u++ {
			for v := 0; v < g.kw; v++ {
				off := v*g.dw - g.pw
				j0, j1 := validRange(g.ow, g.sw, off, g.w)
				f(col[row*p:(row+1)*p], plane, u, off, j0, j1)
				row++
			}
		}
	}
}

// im2col fills col (CK×P) from one sample x (C×H×W).
func im2col[T float](g convGeom, x, col []T) {
	eachTap(g, col, x, func(dst, plane []T, u, off, j0, j1 int) {
		for i := 0; i < g.oh; i++ {
			seg := dst[i*g.ow : (i+1)*g.ow]
			r := i*g.sh - g.ph + u*g.dh
			if r < 0 || r >= g.h {
				clear(seg)
				continue
			}
			src := plane[r*g.w : (r+1)*g.w]
			clear(seg[:j0])
			clear(seg[j1:])
			if g.sw == 1 {
				copy(seg[j0:j1], src[j0+off:j1+off])
				continue
			}
			for j := j0; j < j1; j++ {
				seg[j] = src[j*g.sw+off]
			}
		}
	})
}

// col2im adds col (CK×P) into one sample dx (C×H×W), each entry into the
// pixel im2col took it from.
func col2im[T float](g convGeom, col, dx []T) {
	eachTap(g, col, dx, func(src, plane []T, u, off, j0, j1 int) {
		for i := 0; i < g.oh; i++ {
			r := i*g.sh - g.ph + u*g.dh
			if r < 0 || r >= g.h {
				continue
			}
			seg := src[i*g.ow : (i+1)*g.ow]
			dst := plane[r*g.w : (r+1)*g.w]
			if g.sw == 1 {
				d := dst[j0+off : j1+off]
				s := seg[j0:j1]
				s = s[:len(d)]
				for j, v := range s {
					d[j] += v
				}
				continue
			}
			for j := j0; j < j1; j++ {
				dst[j*g.sw+off] += seg[j]
			}
		}
	})
}

// Stride 1 (the common case, "same" convolutions included) uses a wide
// layout instead of im2col's: with the input zero-padded to Hp×Wp and the
// output computed at every padded column, output position (i, j') is
// i·Wp + j', and the kernel tap (u, v) of channel c sees input element
// c·Hp·Wp + (i + u·dh)·Wp + j' + v·dw. So row (c, u, v) of the wide column
// matrix is one contiguous run of the padded input, copied in one go, where
// im2col copies one short run per output row. The Wp - OW extra columns
// of each output row are computed and dropped (forward) or fed zeros
// (backward, so they add nothing); they cost a little more GEMM and save
// far more copying.

// wide reports whether the wide layout applies.
func (g convGeom) wide() bool { return g.sh == 1 && g.sw == 1 }

// padded returns the padded height and width and the number of wide
// output positions, (OH-1)·Wp + OW: the last row needs no extra columns,
// which keeps every run inside the padded input.
func (g convGeom) padded() (hp, wp, pw int) {
	hp, wp = g.h+2*g.ph, g.w+2*g.pw
	return hp, wp, (g.oh-1)*wp + g.ow
}

// padInput returns sample xn zero-padded to C×Hp×Wp in buf (xn itself when
// there is no padding).
func padInput[T float](g convGeom, xn, buf []T) []T {
	if g.ph == 0 && g.pw == 0 {
		return xn
	}
	hp, wp, _ := g.padded()
	clear(buf)
	for c := 0; c < g.c; c++ {
		for r := 0; r < g.h; r++ {
			copy(buf[c*hp*wp+(r+g.ph)*wp+g.pw:][:g.w], xn[c*g.h*g.w+r*g.w:][:g.w])
		}
	}
	return buf
}

// wideCols fills col (CK×P') from the padded sample xp.
func wideCols[T float](g convGeom, xp, col []T) {
	hp, wp, pw := g.padded()
	row := 0
	for c := 0; c < g.c; c++ {
		for u := 0; u < g.kh; u++ {
			for v := 0; v < g.kw; v++ {
				copy(col[row*pw:(row+1)*pw], xp[c*hp*wp+u*g.dh*wp+v*g.dw:][:pw])
				row++
			}
		}
	}
}

// narrowRows copies the OW real columns of each wide output row of yw
// (rows×P') into y (rows×OH·OW).
func narrowRows[T float](g convGeom, rows int, yw, y []T) {
	_, wp, pw := g.padded()
	p := g.p()
	for o := 0; o < rows; o++ {
		for i := 0; i < g.oh; i++ {
			copy(y[o*p+i*g.ow:][:g.ow], yw[o*pw+i*wp:][:g.ow])
		}
	}
}

// widenRows is narrowRows' inverse, with zeros in the extra columns.
func widenRows[T float](g convGeom, rows int, y, yw []T) {
	_, wp, pw := g.padded()
	p := g.p()
	for o := 0; o < rows; o++ {
		for i := 0; i < g.oh; i++ {
			d := yw[o*pw+i*wp : o*pw+min((i+1)*wp, pw)]
			copy(d, y[o*p+i*g.ow:][:g.ow])
			clear(d[g.ow:])
		}
	}
}

// addWideCols adds col (CK×P') into the padded sample dxp, each row where
// wideCols took it from.
func addWideCols[T float](g convGeom, col, dxp []T) {
	hp, wp, pw := g.padded()
	row := 0
	for c := 0; c < g.c; c++ {
		for u := 0; u < g.kh; u++ {
			for v := 0; v < g.kw; v++ {
				src := col[row*pw : (row+1)*pw]
				dst := dxp[c*hp*wp+u*g.dh*wp+v*g.dw:][:pw]
				for j, x := range src {
					dst[j] += x
				}
				row++
			}
		}
	}
}

// wideScratch holds the scratch buffers of the wide layout for one run of
// a convolution op: the padded input (C×Hp×Wp), the wide column matrix
// (CK×PW) and O wide rows of output or gradient (O×PW).
type wideScratch[T float] struct {
	pw              int // wide columns per row of the column matrix
	xpad, col, rows []T
	done            [3]func()
}

// getWide takes the wide layout's buffers for g from sc.
func getWide[T float](sc *scratch, g convGeom) wideScratch[T] {
	hp, wp, pw := g.padded()
	ws := wideScratch[T]{pw: pw}
	ws.xpad, ws.done[0] = getScratch[T](sc, g.c*hp*wp)
	ws.col, ws.done[1] = getScratch[T](sc, g.ck()*pw)
	ws.rows, ws.done[2] = getScratch[T](sc, g.o*pw)
	return ws
}

// release gives the buffers back.
func (ws wideScratch[T]) release() {
	for _, done := range ws.done {
		done()
	}
}

// convForward computes y (N×O×P) from x (N×C×H×W) and w (O×CK).
func convForward[T float](g convGeom, sc *scratch, gemm gemmFunc[T], x, w, y []T) {
	ck, p := g.ck(), g.p()
	in := g.c * g.h * g.w
	switch {
	case g.direct():
		for n := 0; n < g.n; n++ {
			gemm(blas.NoTrans, blas.NoTrans, g.o, p, ck, 1, w, ck, x[n*in:(n+1)*in], p, 0, y[n*g.o*p:(n+1)*g.o*p], p)
		}
	case g.wide():
		ws := getWide[T](sc, g)
		defer ws.release()
		pw := ws.pw
		for n := 0; n < g.n; n++ {
			wideCols(g, padInput(g, x[n*in:(n+1)*in], ws.xpad), ws.col)
			gemm(blas.NoTrans, blas.NoTrans, g.o, pw, ck, 1, w, ck, ws.col, pw, 0, ws.rows, pw)
			narrowRows(g, g.o, ws.rows, y[n*g.o*p:(n+1)*g.o*p])
		}
	default:
		col, done := getScratch[T](sc, ck*p)
		defer done()
		for n := 0; n < g.n; n++ {
			im2col(g, x[n*in:(n+1)*in], col)
			gemm(blas.NoTrans, blas.NoTrans, g.o, p, ck, 1, w, ck, col, p, 0, y[n*g.o*p:(n+1)*g.o*p], p)
		}
	}
}

// convGradW computes dw (O×CK) = Σ_n dy[n] · col(x[n])ᵀ.
func convGradW[T float](g convGeom, sc *scratch, gemm gemmFunc[T], x, dy, dw []T) {
	ck, p := g.ck(), g.p()
	in := g.c * g.h * g.w
	if g.n == 0 {
		clear(dw)
		return
	}
	beta := func(n int) T {
		if n == 0 {
			return 0
		}
		return 1
	}
	switch {
	case g.direct():
		for n := 0; n < g.n; n++ {
			gemm(blas.NoTrans, blas.Trans, g.o, ck, p, 1, dy[n*g.o*p:(n+1)*g.o*p], p, x[n*in:(n+1)*in], p, beta(n), dw, ck)
		}
	case g.wide():
		ws := getWide[T](sc, g)
		defer ws.release()
		pw := ws.pw
		for n := 0; n < g.n; n++ {
			wideCols(g, padInput(g, x[n*in:(n+1)*in], ws.xpad), ws.col)
			widenRows(g, g.o, dy[n*g.o*p:(n+1)*g.o*p], ws.rows)
			gemm(blas.NoTrans, blas.Trans, g.o, ck, pw, 1, ws.rows, pw, ws.col, pw, beta(n), dw, ck)
		}
	default:
		col, done := getScratch[T](sc, ck*p)
		defer done()
		for n := 0; n < g.n; n++ {
			im2col(g, x[n*in:(n+1)*in], col)
			gemm(blas.NoTrans, blas.Trans, g.o, ck, p, 1, dy[n*g.o*p:(n+1)*g.o*p], p, col, p, beta(n), dw, ck)
		}
	}
}

// transposed returns the geometry of the stride-1 convolution that maps dy
// to dx: dy zero-padded by dilation·(kernel-1) - padding on each side,
// convolved with the flipped kernel whose input and output channels are
// swapped (see flipKernel), gives dx exactly. ok is false when the padding
// exceeds dilation·(kernel-1), which needs cropping this does not do.
func (g convGeom) transposed() (t convGeom, ok bool) {
	qh, qw := g.dh*(g.kh-1)-g.ph, g.dw*(g.kw-1)-g.pw
	if !g.wide() || qh < 0 || qw < 0 {
		return convGeom{}, false
	}
	t = convGeom{n: g.n, c: g.o, h: g.oh, w: g.ow, o: g.c, oh: g.h, ow: g.w,
		kh: g.kh, kw: g.kw, sh: 1, sw: 1, ph: qh, pw: qw, dh: g.dh, dw: g.dw}
	return t, true
}

// flipKernel writes wt[c, o, u, v] = w[o, c, kh-1-u, kw-1-v].
func flipKernel[T float](g convGeom, w, wt []T) {
	kk := g.kh * g.kw
	for o := 0; o < g.o; o++ {
		for c := 0; c < g.c; c++ {
			src := w[(o*g.c+c)*kk : (o*g.c+c+1)*kk]
			dst := wt[(c*g.o+o)*kk : (c*g.o+o+1)*kk]
			for i, v := range src {
				dst[kk-1-i] = v
			}
		}
	}
}

// convGradX computes dx[n] = col2im(Wᵀ · dy[n]). For stride 1 it is
// computed as the equivalent forward convolution of dy (see transposed),
// which copies long runs where col2im adds short ones.
func convGradX[T float](g convGeom, sc *scratch, gemm gemmFunc[T], w, dy, dx []T) {
	ck, p := g.ck(), g.p()
	in := g.c * g.h * g.w
	t, flip := g.transposed()
	switch {
	case flip && !g.direct():
		wt, done := getScratch[T](sc, len(w))
		defer done()
		flipKernel(g, w, wt)
		convForward(t, sc, gemm, dy, wt, dx)
	case g.direct():
		for n := 0; n < g.n; n++ {
			gemm(blas.Trans, blas.NoTrans, ck, p, g.o, 1, w, ck, dy[n*g.o*p:(n+1)*g.o*p], p, 0, dx[n*in:(n+1)*in], p)
		}
	case g.wide():
		hp, wp, pw := g.padded()
		dyw, done1 := getScratch[T](sc, g.o*pw)
		defer done1()
		col, done2 := getScratch[T](sc, ck*pw)
		defer done2()
		pad := g.ph != 0 || g.pw != 0
		var dxpad []T
		if pad {
			var done3 func()
			dxpad, done3 = getScratch[T](sc, g.c*hp*wp)
			defer done3()
		}
		for n := 0; n < g.n; n++ {
			dxn := dx[n*in : (n+1)*in]
			widenRows(g, g.o, dy[n*g.o*p:(n+1)*g.o*p], dyw)
			gemm(blas.Trans, blas.NoTrans, ck, pw, g.o, 1, w, ck, dyw, pw, 0, col, pw)
			if !pad {
				clear(dxn)
				addWideCols(g, col, dxn)
				continue
			}
			clear(dxpad)
			addWideCols(g, col, dxpad)
			for c := 0; c < g.c; c++ {
				for r := 0; r < g.h; r++ {
					copy(dxn[c*g.h*g.w+r*g.w:][:g.w], dxpad[c*hp*wp+(r+g.ph)*wp+g.pw:][:g.w])
				}
			}
		}
	default:
		col, done := getScratch[T](sc, ck*p)
		defer done()
		for n := 0; n < g.n; n++ {
			dxn := dx[n*in : (n+1)*in]
			gemm(blas.Trans, blas.NoTrans, ck, p, g.o, 1, w, ck, dy[n*g.o*p:(n+1)*g.o*p], p, 0, col, p)
			clear(dxn)
			col2im(g, col, dxn)
		}
	}
}

// convOp convolves x [N, C, H, W] with w [O, C, kh, kw] into [N, O, OH, OW]
// (groups 1, no bias).
type convOp struct {
	opkit.Plain
	convParams
	need *inputGrads // which inputs need gradients (nil: both)
	sc   *scratch
}

// convGradXOp is the gradient with respect to x: inputs (w, dy), output
// [N, C, H, W] for the H×W input the op was built for.
type convGradXOp struct {
	opkit.Plain
	convParams
	h, w int
	sc   *scratch
}

// convGradWOp is the gradient with respect to w: inputs (x, dy), output
// [O, C, kh, kw].
type convGradWOp struct {
	opkit.Plain
	convParams
	sc    *scratch
	scale *gradScale // multiplies dw (see Builder.SetGradTarget)
}

func conv2d(bl *Builder, x, w *G.Node, cp convParams) (*G.Node, error) {
	op := convOp{convParams: cp, need: newInputGrads(bl, x, w), sc: &scratch{}}
	if _, err := op.InferShape(x.Shape(), w.Shape()); err != nil {
		return nil, err
	}
	if x.Dtype() != w.Dtype() {
		return nil, fmt.Errorf("models: Conv2d dtype mismatch: input %v, weight %v: %w", x.Dtype(), w.Dtype(), errs.InvalidArgument)
	}
	return G.ApplyOp(op, x, w)
}

// Arity: each of the convolution ops (convOp, convGradXOp, convGradWOp)
// takes two tensors.
func (convParams) Arity() int { return 2 }

// Type: two 4-d tensors to a 4-d tensor, for each of the convolution ops.
func (convParams) Type() hm.Type {
	fourD := G.TensorType{Dims: 4, Of: hm.TypeVariable('a')}
	return hm.NewFnType(fourD, fourD, fourD)
}

func (op convOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	xs, ws, err := twoShapes(op, in)
	if err != nil {
		return nil, err
	}
	if len(ws) != 4 || len(xs) != 4 || ws[1] != xs[1] || ws[2] != op.k[0] || ws[3] != op.k[1] {
		return nil, fmt.Errorf("models: Conv2d with kernel %v: input %v and weight %v do not fit (want [N, C, H, W] and [O, C, %d, %d]): %w",
			op.k, xs, ws, op.k[0], op.k[1], errs.InvalidArgument)
	}
	g, err := op.geom(xs, ws[0])
	if err != nil {
		return nil, err
	}
	return tensor.Shape{g.n, g.o, g.oh, g.ow}, nil
}

func (op convOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes the convolution into prealloc when it fits (see outDense).
func (op convOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	return doConv(op, op.sc, convForward[float64], convForward[float32], prealloc, in)
}

func (op convOp) shapeOf(x, w tensor.Shape) (tensor.Shape, error) { return op.InferShape(x, w) }

// geomOf: inputs x and w.
func (op convOp) geomOf(x, w, _ tensor.Shape) (convGeom, error) { return op.geom(x, w[0]) }

// convStep is one of the convolution ops, as doConv runs it.
type convStep interface {
	fmt.Stringer
	// shapeOf is InferShape for inputs a and b (called directly, it keeps
	// the shapes off the heap, which a generic call of InferShape would not).
	shapeOf(a, b tensor.Shape) (tensor.Shape, error)
	// geomOf is the convolution's geometry for inputs a and b and output out.
	geomOf(a, b, out tensor.Shape) (convGeom, error)
}

// doConv is the UsePreallocDo of the convolution ops: it checks the two
// inputs, works out the output's shape and geometry, and runs k64 or k32
// into prealloc when it fits (see outDense), else into a new tensor.
func doConv[O convStep](op O, sc *scratch, k64 convKernel[float64], k32 convKernel[float32], prealloc G.Value, in []G.Value) (G.Value, error) {
	a, b, err := twoDense(op, in)
	if err != nil {
		return nil, err
	}
	os, err := op.shapeOf(a.Shape(), b.Shape())
	if err != nil {
		return nil, err
	}
	g, err := op.geomOf(a.Shape(), b.Shape(), os)
	if err != nil {
		return nil, err
	}
	out := outDense(prealloc, a.Dtype(), os, a, b)
	if err := runConv(g, sc, k64, k32, a, b, out); err != nil {
		return nil, err
	}
	return out, nil
}

// convKernel is convForward, convGradX or convGradW for element type T.
type convKernel[T float] func(g convGeom, sc *scratch, gemm gemmFunc[T], a, b, out []T)

// runConv runs k64 or k32, as a's dtype says, on the data of a and b, writing
// into out; b and out have a's dtype.
func runConv(g convGeom, sc *scratch, k64 convKernel[float64], k32 convKernel[float32], a, b, out *tensor.Dense) error {
	switch a.Dtype() {
	case tensor.Float64:
		k64(g, sc, tblas.Dgemm, a.Float64s(), b.Float64s(), out.Float64s())
	case tensor.Float32:
		k32(g, sc, tblas.Sgemm, a.Float32s(), b.Float32s(), out.Float32s())
	default:
		return checkFloat(a.Dtype())
	}
	return nil
}

// twoDense unpacks two dense inputs of one float dtype.
func twoDense[O fmt.Stringer](op O, in []G.Value) (a, b *tensor.Dense, err error) {
	if a, b, err = twoValues(op, in); err != nil {
		return nil, nil, err
	}
	if a.Dtype() != b.Dtype() {
		return nil, nil, fmt.Errorf("models: %v dtype mismatch: %v and %v: %w", op, a.Dtype(), b.Dtype(), errs.InvalidArgument)
	}
	return a, b, checkFloat(a.Dtype())
}

func (op convOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op convOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op convOp) String() string        { return "Conv2d{" + op.convParams.String() + "}" }
func (op convOp) DiffWRT(int) []bool    { return []bool{op.need.need(0), op.need.need(1)} }

// SymDiff returns the exact gradients (convGradXOp, convGradWOp); an input
// that needs no gradient (see gradScope) gets none.
func (op convOp) SymDiff(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("models: %v takes 2 inputs, got %d: %w", op, len(in), errs.InvalidArgument)
	}
	x, w := in[0], in[1]
	var dx, dw *G.Node
	var err error
	if op.need.need(0) {
		xs := x.Shape()
		if dx, err = G.ApplyOp(convGradXOp{convParams: op.convParams, h: xs[2], w: xs[3], sc: &scratch{}}, w, grad); err != nil {
			return nil, err
		}
	}
	if op.need.need(1) {
		if dw, err = G.ApplyOp(convGradWOp{convParams: op.convParams, sc: &scratch{}, scale: &gradScale{}}, x, grad); err != nil {
			return nil, err
		}
	}
	return G.Nodes{dx, dw}, nil
}

func (op convGradXOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	ws, dys, err := twoShapes(op, in)
	if err != nil {
		return nil, err
	}
	if len(ws) != 4 || len(dys) != 4 {
		return nil, fmt.Errorf("models: %v needs a 4-d weight and gradient, got %v and %v: %w", op, ws, dys, errs.InvalidArgument)
	}
	xs := tensor.Shape{dys[0], ws[1], op.h, op.w}
	g, err := op.geom(xs, ws[0])
	if err != nil {
		return nil, err
	}
	if dys[1] != g.o || dys[2] != g.oh || dys[3] != g.ow {
		return nil, fmt.Errorf("models: %v: gradient %v does not fit input %v and weight %v: %w", op, dys, xs, ws, errs.InvalidArgument)
	}
	return xs, nil
}
func (op convGradXOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes dx into prealloc when it fits (see outDense).
func (op convGradXOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	return doConv(op, op.sc, convGradX[float64], convGradX[float32], prealloc, in)
}

func (op convGradXOp) shapeOf(w, dy tensor.Shape) (tensor.Shape, error) { return op.InferShape(w, dy) }

// geomOf: inputs w and dy, output dx.
func (op convGradXOp) geomOf(w, _, dx tensor.Shape) (convGeom, error) { return op.geom(dx, w[0]) }

func (op convGradXOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op convGradXOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op convGradXOp) String() string {
	return fmt.Sprintf("Conv2dGradX{%v,in:%dx%d}", op.convParams, op.h, op.w)
}
func (op convGradXOp) DiffWRT(int) []bool { return []bool{false, false} }
func (op convGradXOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: second derivatives of Conv2d are not implemented: %w", errors.ErrUnsupported)
}

func (op convGradWOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	xs, dys, err := twoShapes(op, in)
	if err != nil {
		return nil, err
	}
	if len(dys) != 4 {
		return nil, fmt.Errorf("models: %v needs a 4-d gradient, got %v: %w", op, dys, errs.InvalidArgument)
	}
	g, err := op.geom(xs, dys[1])
	if err != nil {
		return nil, err
	}
	if dys[0] != g.n || dys[2] != g.oh || dys[3] != g.ow {
		return nil, fmt.Errorf("models: %v: gradient %v does not fit input %v: %w", op, dys, xs, errs.InvalidArgument)
	}
	return tensor.Shape{g.o, g.c, g.kh, g.kw}, nil
}
func (op convGradWOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes dw into prealloc when it fits (see outDense),
// multiplied by the op's scale (see Builder.SetGradTarget).
func (op convGradWOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	out, err := doConv(op, op.sc, convGradW[float64], convGradW[float32], prealloc, in)
	if err != nil {
		return nil, err
	}
	scaleDense(out.(*tensor.Dense), op.scale.factor())
	return out, nil
}

func (op convGradWOp) shapeOf(x, dy tensor.Shape) (tensor.Shape, error) { return op.InferShape(x, dy) }

// geomOf: inputs x and dy.
func (op convGradWOp) geomOf(x, dy, _ tensor.Shape) (convGeom, error) { return op.geom(x, dy[1]) }

func (op convGradWOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op convGradWOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op convGradWOp) String() string        { return "Conv2dGradW{" + op.convParams.String() + "}" }
func (op convGradWOp) DiffWRT(int) []bool    { return []bool{false, false} }
func (op convGradWOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: second derivatives of Conv2d are not implemented: %w", errors.ErrUnsupported)
}

func (op convGradWOp) scaleCell() *gradScale { return op.scale }
