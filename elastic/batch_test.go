package elastic_test

import (
	"errors"
	"testing"

	"github.com/tandemml/tandem/elastic"
	"github.com/tandemml/tandem/internal/errs"
)

// TestPerRankBatch: each rank keeps its batch; the learning rate is left
// alone by PerRankBatch and follows the world's size from the base size
// with PerRankBatchScaleLR; sizes below 1 are refused.
func TestPerRankBatch(t *testing.T) {
	for _, c := range []struct {
		rule   elastic.BatchRule
		size   int
		scaled float64
	}{
		{elastic.PerRankBatch(16), 3, 1},
		{elastic.PerRankBatchScaleLR(16, 2), 3, 1.5},
		{elastic.PerRankBatchScaleLR(16, 2), 1, 0.5},
	} {
		n, lr, err := c.rule.Batch(c.size)
		if err != nil || n != 16 || lr != c.scaled {
			t.Errorf("%v at size %d: batch %d, lr ×%v, %v; want 16, ×%v", c.rule, c.size, n, lr, err, c.scaled)
		}
	}
	for _, r := range []elastic.BatchRule{elastic.PerRankBatch(0), elastic.PerRankBatchScaleLR(4, 0)} {
		if _, _, err := r.Batch(2); !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("%v: %v, want InvalidArgument", r, err)
		}
	}
}
