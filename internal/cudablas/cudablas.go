//go:build tandemcuda

package cudablas

// #cgo LDFLAGS: -lcublas -lcuda
// #include <cublas_v2.h>
//
// // Device pointers travel as integers (CUdeviceptr) and become pointers
// // here, on the C side.
// static cublasStatus_t tandemSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
//     int m, int n, int k, float alpha, unsigned long long a, int lda,
//     unsigned long long b, int ldb, float beta, unsigned long long c, int ldc) {
//   return cublasSgemm(h, ta, tb, m, n, k, &alpha, (const float *)a, lda,
//                      (const float *)b, ldb, &beta, (float *)c, ldc);
// }
// static cublasStatus_t tandemSaxpy(cublasHandle_t h, int n, float alpha,
//     unsigned long long x, unsigned long long y) {
//   return cublasSaxpy(h, n, &alpha, (const float *)x, 1, (float *)y, 1);
// }
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/devstage"
	"gorgonia.org/tensor"
)

// BLAS is a cuBLAS handle bound to one CUDA device and its stream.
type BLAS struct {
	dev    *devstage.CUDA
	handle C.cublasHandle_t
}

// New creates a cuBLAS handle on dev whose work runs on dev's stream.
func New(dev *devstage.CUDA) (*BLAS, error) {
	if dev == nil {
		return nil, fmt.Errorf("cudablas: new: nil device: %w", comm.ErrInvalidArgument)
	}
	b := &BLAS{dev: dev}
	err := dev.Do(func() error {
		if st := C.cublasCreate(&b.handle); st != C.CUBLAS_STATUS_SUCCESS {
			return statusError("cublasCreate", st)
		}
		s := dev.Stream()
		if st := C.cublasSetStream(b.handle, C.cudaStream_t(unsafe.Pointer(s.C()))); st != C.CUBLAS_STATUS_SUCCESS {
			C.cublasDestroy(b.handle)
			return statusError("cublasSetStream", st)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cudablas: new: %w", err)
	}
	return b, nil
}

// Close destroys the handle.
func (b *BLAS) Close() error {
	return b.dev.Do(func() error {
		if st := C.cublasDestroy(b.handle); st != C.CUBLAS_STATUS_SUCCESS {
			return fmt.Errorf("cudablas: close: %w", statusError("cublasDestroy", st))
		}
		return nil
	})
}

func statusError(call string, st C.cublasStatus_t) error {
	return fmt.Errorf("%s: cublasStatus %d", call, int(st))
}

// Sgemm queues C = alpha·op(A)·op(B) + beta·C on the device's stream, for
// row-major float32 matrices in device buffers: op(A) is m×k, op(B) k×n, C
// m×n, and tA, tB say whether A and B are stored transposed; lda, ldb and
// ldc are the row strides in elements (internal/blas.Sgemm's convention).
// It returns when the product is queued; a copy queued on the stream after
// it (a Stager's, dev.Read after the stream) sees the result.
func (b *BLAS) Sgemm(tA, tB bool, m, n, k int, alpha float32, a *devstage.CUDABuffer, lda int, bm *devstage.CUDABuffer, ldb int, beta float32, c *devstage.CUDABuffer, ldc int) error {
	if m < 0 || n < 0 || k < 0 {
		return fmt.Errorf("cudablas: sgemm: dimensions %d×%d×%d: %w", m, n, k, comm.ErrInvalidArgument)
	}
	ar, ac := m, k
	if tA {
		ar, ac = k, m
	}
	br, bc := k, n
	if tB {
		br, bc = n, k
	}
	for _, x := range []struct {
		name       string
		buf        *devstage.CUDABuffer
		rows, cols int
		ld         int
	}{{"A", a, ar, ac, lda}, {"B", bm, br, bc, ldb}, {"C", c, m, n, ldc}} {
		if err := check(x.name, x.buf, x.rows, x.cols, x.ld); err != nil {
			return err
		}
	}
	if m == 0 || n == 0 {
		return nil
	}
	// Row-major C is column-major Cᵀ, and Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLAS is
	// given B for its first operand and A for its second, and n×m for the
	// shape.
	opA, opB := C.cublasOperation_t(C.CUBLAS_OP_N), C.cublasOperation_t(C.CUBLAS_OP_N)
	if tA {
		opA = C.CUBLAS_OP_T
	}
	if tB {
		opB = C.CUBLAS_OP_T
	}
	return b.dev.Do(func() error {
		st := C.tandemSgemm(b.handle, opB, opA, C.int(n), C.int(m), C.int(k), C.float(alpha),
			C.ulonglong(bm.Ptr), C.int(ldb), C.ulonglong(a.Ptr), C.int(lda),
			C.float(beta), C.ulonglong(c.Ptr), C.int(ldc))
		if st != C.CUBLAS_STATUS_SUCCESS {
			return fmt.Errorf("cudablas: sgemm %d×%d×%d: %w", m, n, k, statusError("cublasSgemm", st))
		}
		return nil
	})
}

// Saxpy queues y += alpha·x on the device's stream, for float32 buffers of
// the same length (an SGD step is Saxpy(-lr, grad, param)).
func (b *BLAS) Saxpy(alpha float32, x, y *devstage.CUDABuffer) error {
	if x == nil || y == nil {
		return fmt.Errorf("cudablas: saxpy: nil buffer: %w", comm.ErrInvalidArgument)
	}
	if err := check("x", x, 1, max(x.Len(), 1), max(x.Len(), 1)); err != nil {
		return err
	}
	if err := check("y", y, 1, max(y.Len(), 1), max(y.Len(), 1)); err != nil {
		return err
	}
	if x.Len() != y.Len() {
		return fmt.Errorf("cudablas: saxpy: x has %d elements, y %d: %w", x.Len(), y.Len(), comm.ErrInvalidArgument)
	}
	return b.dev.Do(func() error {
		if st := C.tandemSaxpy(b.handle, C.int(x.Len()), C.float(alpha), C.ulonglong(x.Ptr), C.ulonglong(y.Ptr)); st != C.CUBLAS_STATUS_SUCCESS {
			return fmt.Errorf("cudablas: saxpy of %d: %w", x.Len(), statusError("cublasSaxpy", st))
		}
		return nil
	})
}

// check says whether buf holds a rows×cols row-major float32 matrix with
// row stride ld.
func check(name string, buf *devstage.CUDABuffer, rows, cols, ld int) error {
	if buf == nil {
		return fmt.Errorf("cudablas: sgemm: %s is nil: %w", name, comm.ErrInvalidArgument)
	}
	if buf.Dtype() != tensor.Float32 {
		return fmt.Errorf("cudablas: sgemm: %s holds %v, not float32: %w", name, buf.Dtype(), comm.ErrInvalidArgument)
	}
	if ld < max(cols, 1) {
		return fmt.Errorf("cudablas: sgemm: %s's stride %d is less than its %d columns: %w", name, ld, cols, comm.ErrInvalidArgument)
	}
	if rows > 0 && cols > 0 && (rows-1)*ld+cols > buf.Len() {
		return fmt.Errorf("cudablas: sgemm: %s is %d×%d with stride %d, %d elements, but the buffer holds %d: %w", name, rows, cols, ld, (rows-1)*ld+cols, buf.Len(), comm.ErrInvalidArgument)
	}
	return nil
}
