package main

import (
	"context"
	"fmt"
	"math"
	"strings"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/models"
)

// A run diverges when its loss, its gradients or its weights stop being
// finite numbers (too high a learning rate, a corrupt input). Every rank
// then stops at the same step with an error saying what went wrong where,
// and nothing is saved: the checkpoints already in -out, the last good one
// included, stay as they are. The ranks agree without extra communication
// while all is well:
//
//   - after every step, each rank checks the gradients that DDP averaged
//     over the ranks; they are bit for bit the same on every rank, so every
//     rank stops at the same step (a NaN on any rank's batch reaches every
//     rank's averaged gradients);
//   - after every epoch, the all-reduced training loss, the test loss and
//     the weights and optimizer state, all the same on every rank, are
//     checked before rank 0 saves, which catches a non-finite loss whose
//     gradients stayed finite.
//
// Once they have stopped, the ranks pool what each saw (one small
// all-reduce) so that the message names the rank whose loss went first.

// exitDiverged is the exit status of a run that diverged.
const exitDiverged = 4

// divergedError stops a run whose loss, gradients or weights are not
// finite.
type divergedError struct{ msg string }

func (e *divergedError) Error() string { return e.msg }

// nanInput is a test aid: it makes one rank's batch at one step hold a NaN,
// as a corrupt input record would, so that the tests can watch a run
// diverge. It is set only by tests (config.nanInput); no flag reaches it.
type nanInput struct {
	Epoch, Step, Rank int // epoch and step from 1
}

// poison returns a copy of x whose first element is NaN.
func poison(x *tensor.Dense) *tensor.Dense {
	c := x.Clone().(*tensor.Dense)
	switch d := c.Data().(type) {
	case []float32:
		d[0] = float32(math.NaN())
	case []float64:
		d[0] = math.NaN()
	}
	return c
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// gradsFinite reports whether every gradient of params is finite.
func gradsFinite(params []*models.Param) bool {
	for _, p := range params {
		if p.Grad == nil {
			continue
		}
		switch d := p.Grad.Data().(type) {
		case []float32:
			if !finite32(d) {
				return false
			}
		case []float64:
			for _, v := range d {
				if v-v != 0 { // NaN or ±Inf
					return false
				}
			}
		}
	}
	return true
}

// finite32 reports whether every value of d is finite. v-v is 0 for a
// finite v and NaN otherwise, and NaN sticks in a sum: four independent
// sums without branches keep the loop at about a value per cycle.
func finite32(d []float32) bool {
	var a, b, c, e float32
	for ; len(d) >= 4; d = d[4:] {
		a += d[0] - d[0]
		b += d[1] - d[1]
		c += d[2] - d[2]
		e += d[3] - d[3]
	}
	for _, v := range d {
		a += v - v
	}
	return a+b+c+e == 0
}

// lossAt is one rank's report: the step of its first non-finite loss of the
// epoch (0: none) or of the step where the run stopped, and that loss.
type lossAt struct {
	Step int
	Loss float64
}

// poolLosses gives every rank each rank's lossAt. Every rank calls it at
// the same point, having detected the divergence from values that are the
// same on every rank.
func poolLosses(ctx context.Context, pg *comm.ProcessGroup, mine lossAt) ([]lossAt, error) {
	n := pg.Size()
	v := tensor.New(tensor.WithShape(2*n), tensor.WithBacking(make([]float64, 2*n)))
	v.Float64s()[2*pg.Rank()] = float64(mine.Step)
	v.Float64s()[2*pg.Rank()+1] = mine.Loss
	if n > 1 {
		if err := pg.AllReduce(ctx, v, comm.Sum).Wait(ctx); err != nil {
			return nil, err
		}
	}
	out := make([]lossAt, n)
	for r := range out {
		out[r] = lossAt{int(v.Float64s()[2*r]), v.Float64s()[2*r+1]}
	}
	return out, nil
}

// diverged builds the error that stops the run: where is "epoch E/N" or
// "epoch E/N, step S", what the failed check, and all the ranks' losses
// (nil when not pooled); lastGood is the last checkpoint written or resumed
// from ("" for none), out the checkpoint folder ("" when not saving).
func diverged(where, what string, losses []lossAt, perStep bool, out, lastGood string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "training diverged at %s: %s", where, what)
	if losses != nil {
		var parts []string
		for r, l := range losses {
			switch {
			case perStep:
				parts = append(parts, fmt.Sprintf("rank %d %v", r, fmtLoss(l.Loss)))
			case l.Step > 0:
				parts = append(parts, fmt.Sprintf("rank %d %v at step %d", r, fmtLoss(l.Loss), l.Step))
			}
		}
		if perStep {
			fmt.Fprintf(&b, "; the loss at that step: %s", strings.Join(parts, ", "))
		} else if len(parts) > 0 {
			fmt.Fprintf(&b, "; the first non-finite loss: %s", strings.Join(parts, ", "))
		}
	}
	switch {
	case out == "":
		b.WriteString("; stopped")
	case lastGood != "":
		fmt.Fprintf(&b, "; stopped without saving: the last good checkpoint is %s, which -resume continues from", lastGood)
	default:
		b.WriteString("; stopped before any checkpoint was written (a lower -lr may help)")
	}
	return &divergedError{b.String()}
}

func fmtLoss(v float64) string {
	if finite(v) {
		return fmt.Sprintf("%.5g", v)
	}
	return fmt.Sprint(v) // NaN, +Inf, -Inf
}
