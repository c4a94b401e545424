package main

import (
	"context"
	"fmt"
	"math"
	"sync"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
)

// evaluator measures the model on the test set. Every rank takes one
// contiguous shard of it, runs the model forward in evaluation mode, and the
// ranks all-reduce three numbers: correct predictions, summed loss and
// examples seen. Every rank gets the result for the whole set.
type evaluator struct {
	pg     *comm.ProcessGroup
	model  models.Module
	loader *data.Loader
	progs  map[string]*evalProgram
}

// evalProgram is the forward graph of one batch shape.
type evalProgram struct {
	prog   *graph.Program
	x, out *G.Node
}

// shardSampler visits the examples lo..hi-1 in order: one rank's shard of
// the test set.
type shardSampler struct{ lo, hi int }

func (s shardSampler) Indices(int) []int {
	out := make([]int, 0, s.hi-s.lo)
	for i := s.lo; i < s.hi; i++ {
		out = append(out, i)
	}
	return out
}

func (s shardSampler) Len() int { return s.hi - s.lo }

func newEvaluator(pg *comm.ProcessGroup, model models.Module, test data.Dataset, batch int) (*evaluator, error) {
	n, r, w := test.Len(), pg.Rank(), pg.Size()
	shard := shardSampler{lo: r * n / w, hi: (r + 1) * n / w}
	var loader *data.Loader
	if shard.Len() > 0 {
		var err error
		loader, err = data.NewLoader(test, batch, data.WithSampler(shard), data.Prefetch(2))
		if err != nil {
			return nil, err
		}
	}
	return &evaluator{pg: pg, model: model, loader: loader, progs: map[string]*evalProgram{}}, nil
}

// buildMu serializes the building of graphs in this process: gorgonia
// numbers some nodes from package-level counters, so goroutine ranks (the
// tests) building graphs at the same moment would race on them. A graph is
// built once per batch shape, so the lock costs nothing in steady state.
var buildMu sync.Mutex

func (e *evaluator) program(x *tensor.Dense) (*evalProgram, error) {
	key := fmt.Sprint(x.Shape())
	if p, ok := e.progs[key]; ok {
		return p, nil
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	b := models.NewBuilder(nil, models.WithMode(models.Eval))
	xn := b.Bind("x", x)
	out, err := e.model.Forward(b, xn)
	if err != nil {
		return nil, err
	}
	prog, err := graph.Compile(b.Graph(), graph.EvalMode())
	if err != nil {
		return nil, err
	}
	p := &evalProgram{prog: prog, x: xn, out: out}
	e.progs[key] = p
	return p, nil
}

// evalResult is the model's score on the whole test set.
type evalResult struct {
	Accuracy float64 // fraction of correct predictions
	Loss     float64 // mean cross entropy
	N        int     // examples evaluated
}

// run evaluates the model on this rank's shard and combines the shards.
func (e *evaluator) run(ctx context.Context) (evalResult, error) {
	var correct, lossSum, seen float64
	if e.loader != nil {
		for batch, err := range e.loader.Epoch(ctx, 0) {
			if err != nil {
				return evalResult{}, err
			}
			p, err := e.program(batch.X)
			if err != nil {
				return evalResult{}, fmt.Errorf("building the evaluation graph: %w", err)
			}
			if err := p.prog.Run(ctx, graph.Bind(p.x, batch.X)); err != nil {
				return evalResult{}, fmt.Errorf("evaluating: %w", err)
			}
			logits, ok := p.out.Value().(*tensor.Dense)
			if !ok {
				return evalResult{}, fmt.Errorf("evaluating: logits of type %T", p.out.Value())
			}
			c, l, err := scoreBatch(logits, batch.Labels())
			if err != nil {
				return evalResult{}, err
			}
			correct += c
			lossSum += l
			seen += float64(batch.Size())
		}
	}
	sums := tensor.New(tensor.WithShape(3), tensor.WithBacking([]float64{correct, lossSum, seen}))
	if e.pg.Size() > 1 {
		if err := e.pg.AllReduce(ctx, sums, comm.Sum).Wait(ctx); err != nil {
			return evalResult{}, fmt.Errorf("combining the test shards: %w", err)
		}
	}
	s := sums.Float64s()
	if s[2] == 0 {
		return evalResult{}, fmt.Errorf("the test set is empty")
	}
	return evalResult{Accuracy: s[0] / s[2], Loss: s[1] / s[2], N: int(s[2])}, nil
}

// scoreBatch counts the rows of logits [B, C] whose largest entry is at the
// label, and sums their cross entropy, -log softmax(logits)[label].
func scoreBatch(logits *tensor.Dense, labels []int64) (correct, lossSum float64, err error) {
	sh := logits.Shape()
	if len(sh) != 2 || sh[0] != len(labels) {
		return 0, 0, fmt.Errorf("logits of shape %v for %d labels", sh, len(labels))
	}
	rows, cols := sh[0], sh[1]
	row := make([]float64, cols)
	for i := range rows {
		switch d := logits.Data().(type) {
		case []float32:
			for j := range cols {
				row[j] = float64(d[i*cols+j])
			}
		case []float64:
			copy(row, d[i*cols:(i+1)*cols])
		default:
			return 0, 0, fmt.Errorf("logits of dtype %v", logits.Dtype())
		}
		label := int(labels[i])
		if label < 0 || label >= cols {
			return 0, 0, fmt.Errorf("label %d outside [0, %d)", label, cols)
		}
		best, top := 0, math.Inf(-1)
		for j, v := range row {
			if v > top {
				best, top = j, v
			}
		}
		if best == label {
			correct++
		}
		var z float64
		for _, v := range row {
			z += math.Exp(v - top)
		}
		lossSum += top + math.Log(z) - row[label]
	}
	return correct, lossSum, nil
}
