package vec

// Add sets dst[i] = x[i] + y[i] for i < len(x); dst and y must be at
// least as long as x.
func Add(dst, x, y []float32) {
	dst, y = dst[:len(x)], y[:len(x)]
	n := 0
	if haveAVX {
		n = len(x) &^ 7
		if n > 0 {
			addAVX(&dst[0], &x[0], &y[0], n)
		}
	}
	for i := n; i < len(x); i++ {
		dst[i] = x[i] + y[i]
	}
}

// Mul sets dst[i] = x[i] * y[i] for i < len(x); dst and y must be at
// least as long as x.
func Mul(dst, x, y []float32) {
	dst, y = dst[:len(x)], y[:len(x)]
	n := 0
	if haveAVX {
		n = len(x) &^ 7
		if n > 0 {
			mulAVX(&dst[0], &x[0], &y[0], n)
		}
	}
	for i := n; i < len(x); i++ {
		dst[i] = x[i] * y[i]
	}
}

// AddReLU sets dst[i] = max(x[i]+y[i], 0) for i < len(x), with Go's max: a
// NaN sum stays NaN and a sum of -0 gives +0. dst and y must be at least
// as long as x.
func AddReLU(dst, x, y []float32) {
	dst, y = dst[:len(x)], y[:len(x)]
	n := 0
	if haveAVX {
		n = len(x) &^ 7
		if n > 0 {
			addReLUAVX(&dst[0], &x[0], &y[0], n)
		}
	}
	for i := n; i < len(x); i++ {
		dst[i] = max(x[i]+y[i], 0)
	}
}

// AddTo adds x into dst: dst[i] += x[i] for i < len(x); dst must be at
// least as long as x.
func AddTo(dst, x []float32) {
	dst = dst[:len(x)]
	n := 0
	if haveAVX {
		n = len(x) &^ 7
		if n > 0 {
			addToAVX(&dst[0], &x[0], n)
		}
	}
	for i := n; i < len(x); i++ {
		dst[i] += x[i]
	}
}

// ReLUMask sets dst[i] = dy[i] where x[i] > 0 and +0 elsewhere (NaN x
// included): ReLU's backward pass, dy's bits kept as they are. dst and dy
// must be at least as long as x.
func ReLUMask(dst, x, dy []float32) {
	dst, dy = dst[:len(x)], dy[:len(x)]
	n := 0
	if haveAVX {
		n = len(x) &^ 7
		if n > 0 {
			reluMaskAVX(&dst[0], &x[0], &dy[0], n)
		}
	}
	for i := n; i < len(x); i++ {
		if x[i] > 0 {
			dst[i] = dy[i]
		} else {
			dst[i] = 0
		}
	}
}
