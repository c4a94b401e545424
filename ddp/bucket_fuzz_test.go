package ddp

import (
	"testing"

	"gorgonia.org/tensor"
)

// FuzzAssignBuckets checks the invariants of the bucket layout for arbitrary
// sizes, dtypes, caps and orders: every parameter lands in exactly one
// bucket, a bucket holds one dtype, keeps the walk order inside it, is
// closed only once it reached its cap (only each dtype's last bucket may
// stay below), and buckets are ordered by their first parameter.
func FuzzAssignBuckets(f *testing.F) {
	f.Add([]byte{10, 20, 30, 40, 50}, uint16(60), uint16(25), uint8(0))
	f.Add([]byte{255, 1, 1, 255, 7}, uint16(1), uint16(1), uint8(3))
	f.Fuzz(func(t *testing.T, sizes []byte, first, rest uint16, rot uint8) {
		n := len(sizes)
		if n == 0 || n > 64 {
			return
		}
		bytes := make([]int64, n)
		dts := make([]tensor.Dtype, n)
		order := make([]int, n)
		for i, s := range sizes {
			bytes[i] = int64(s%64+1) * 4
			if s&64 != 0 {
				dts[i] = tensor.Float64
			} else {
				dts[i] = tensor.Float32
			}
			order[i] = (i + int(rot)) % n
		}
		limits := []int64{int64(first) + 1, int64(rest) + 1}
		got := assignBuckets(order, bytes, dts, limits)
		pos := make([]int, n)
		for i, p := range order {
			pos[p] = i
		}
		seen := make([]bool, n)
		perDtype := map[tensor.Dtype]int{}
		lastOfDtype := map[tensor.Dtype]int{}
		for bi, b := range got {
			if len(b) == 0 {
				t.Fatalf("bucket %d is empty", bi)
			}
			lastOfDtype[dts[b[0]]] = bi
		}
		prevFirst := -1
		for bi, b := range got {
			dt := dts[b[0]]
			var size int64
			for k, p := range b {
				if seen[p] {
					t.Fatalf("parameter %d in two buckets", p)
				}
				seen[p] = true
				if dts[p] != dt {
					t.Fatalf("bucket %d mixes dtypes", bi)
				}
				if k > 0 && pos[p] < pos[b[k-1]] {
					t.Fatalf("bucket %d breaks the walk order: %v", bi, b)
				}
				size += bytes[p]
			}
			limit := limits[min(perDtype[dt], len(limits)-1)]
			perDtype[dt]++
			if bi != lastOfDtype[dt] && size < limit {
				t.Fatalf("bucket %d closed at %d bytes below its cap %d", bi, size, limit)
			}
			if size-bytes[b[len(b)-1]] >= limit {
				t.Fatalf("bucket %d went on after reaching its cap: %v", bi, b)
			}
			if pos[b[0]] <= prevFirst {
				t.Fatalf("buckets out of order")
			}
			prevFirst = pos[b[0]]
		}
		for p, ok := range seen {
			if !ok {
				t.Fatalf("parameter %d in no bucket", p)
			}
		}
	})
}
