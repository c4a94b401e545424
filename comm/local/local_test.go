package local_test

import (
	"context"
	"testing"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/local"
)

func TestConformance(t *testing.T) {
	commtest.RunConformance(t, func(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup {
		pgs, err := local.NewGroups(context.Background(), n, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return pgs
	})
}
