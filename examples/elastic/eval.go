package main

import (
	"context"
	"fmt"
	"sync"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
)

// buildMu serializes graph building in this process (gorgonia numbers some
// nodes from package-level counters).
var buildMu sync.Mutex

// evaluate returns the model's accuracy on the whole test set.
func evaluate(ctx context.Context, model models.Module, test data.Dataset) (float64, error) {
	loader, err := data.NewLoader(test, 1000)
	if err != nil {
		return 0, err
	}
	progs := map[int]*evalProgram{}
	correct, seen := 0, 0
	for batch, err := range loader.Epoch(ctx, 0) {
		if err != nil {
			return 0, err
		}
		n := batch.Size()
		p, ok := progs[n]
		if !ok {
			if p, err = compileEval(model, batch.X); err != nil {
				return 0, err
			}
			progs[n] = p
		}
		if err := p.prog.Run(ctx, graph.Bind(p.x, batch.X)); err != nil {
			return 0, fmt.Errorf("evaluating: %w", err)
		}
		logits, ok := p.out.Value().(*tensor.Dense)
		if !ok {
			return 0, fmt.Errorf("evaluating: logits of type %T", p.out.Value())
		}
		correct += countCorrect(logits.Float32s(), batch.Labels(), logits.Shape()[1])
		seen += n
	}
	return float64(correct) / float64(seen), nil
}

type evalProgram struct {
	prog   *graph.Program
	x, out *G.Node
}

func compileEval(model models.Module, x *tensor.Dense) (*evalProgram, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	b := models.NewBuilder(nil, models.WithMode(models.Eval))
	xn := b.Bind("x", x)
	out, err := model.Forward(b, xn)
	if err != nil {
		return nil, err
	}
	prog, err := graph.Compile(b.Graph(), graph.EvalMode())
	if err != nil {
		return nil, fmt.Errorf("building the evaluation graph: %w", err)
	}
	return &evalProgram{prog: prog, x: xn, out: out}, nil
}

// countCorrect counts the rows of logits whose largest entry is at the label.
func countCorrect(logits []float32, labels []int64, classes int) int {
	correct := 0
	for i, label := range labels {
		row := logits[i*classes : (i+1)*classes]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		if int64(best) == label {
			correct++
		}
	}
	return correct
}
