//go:build unix

package main

// `tandem bench graph`: one training step (forward, backward, SGD update) of
// an MLP with gorgonia's TapeMachine and with Tandem's graph executor.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/cputime"
)

func init() {
	benches["graph"] = command{
		summary: "MLP training step, TapeMachine vs graph executor: tandem bench graph [-sizes 784,1024,1024,10] [-batch 64] [-steps 20] [-workers 1,N] [-json]",
		run:     benchGraph,
	}
}

// graphBenchResult is one line of `tandem bench graph -json`.
type graphBenchResult struct {
	Bench       string  `json:"bench"`
	Engine      string  `json:"engine"`
	Workers     int     `json:"workers,omitempty"`
	Steps       int     `json:"steps"`
	MsPerStep   float64 `json:"ms_per_step"` // median wall time of a step
	MeanMs      float64 `json:"mean_ms"`
	CPUMsStep   float64 `json:"cpu_ms_per_step"` // process CPU time per step (all threads)
	AllocsStep  float64 `json:"allocs_per_step"`
	BytesStep   float64 `json:"bytes_per_step"`
	SpeedupVsTM float64 `json:"speedup_vs_tapemachine,omitempty"`
}

func benchGraph(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tandem bench graph", flag.ContinueOnError)
	mlp := addMLPStepFlags(fs, 20, "timed training steps per engine")
	workersFlag := fs.String("workers", "1,"+strconv.Itoa(runtime.GOMAXPROCS(0)), "comma-separated executor worker `counts`")
	asJSON := fs.Bool("json", false, "print one JSON object per engine")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sizes, err := mlp.layerSizes()
	if err != nil {
		return err
	}
	workers, err := parseInts(*workersFlag)
	if err != nil {
		return fmt.Errorf("-workers: %w", err)
	}
	batch, steps := *mlp.batch, *mlp.steps

	// One model per engine, all with the same weights and data.
	tape, err := newMLPStep(sizes, batch)
	if err != nil {
		return err
	}
	tm := G.NewTapeMachine(tape.g)
	defer tm.Close()
	engines := []benchEngine{{name: "tapemachine", step: func() error {
		if err := tape.bind(); err != nil {
			return err
		}
		if err := tm.RunAll(); err != nil {
			return err
		}
		tape.sgd(func(i int) G.Value { return tape.grads[i].Value() })
		tm.Reset()
		return nil
	}}}
	for _, w := range workers {
		m, err := newMLPStep(sizes, batch)
		if err != nil {
			return err
		}
		prog, err := graph.Compile(m.g, graph.Workers(w), graph.WithGrads(m.params, m.grads))
		if err != nil {
			return err
		}
		bx, by := graph.Bind(m.x, m.xv), graph.Bind(m.y, m.yv)
		engines = append(engines, benchEngine{name: "executor", workers: w, step: func() error {
			if err := prog.Run(ctx, bx, by); err != nil {
				return err
			}
			m.sgd(func(i int) G.Value { return m.grads[i].Value() })
			return nil
		}})
	}

	if !*asJSON {
		fmt.Printf("MLP %v, batch %d, float32; forward + backward + SGD; %d steps per engine, in rotating blocks of 2\n", sizes, batch, steps)
	}
	for i := range engines {
		if err := engines[i].step(); err != nil { // warm-up: first-run allocations
			return fmt.Errorf("%s: %w", engines[i].name, err)
		}
	}
	// Run the engines in rounds of a few steps each, rotating their order, so
	// that load from other processes and garbage collection triggered by one
	// engine's allocations affect them alike; the median step is reported.
	const block = 2
	for round := 0; round*block < steps; round++ {
		for k := range engines {
			e := &engines[(round+k)%len(engines)]
			for s := 0; s < block && round*block+s < steps; s++ {
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := e.timedStep(); err != nil {
					return fmt.Errorf("%s: %w", e.name, err)
				}
			}
		}
	}
	tmMs := engines[0].msPerStep()
	for _, e := range engines {
		r := graphBenchResult{
			Bench: "graph", Engine: e.name, Workers: e.workers, Steps: e.steps,
			MsPerStep: e.msPerStep(), MeanMs: e.meanMs(), CPUMsStep: e.cpuMs(), AllocsStep: float64(e.mallocs) / float64(e.steps), BytesStep: float64(e.bytes) / float64(e.steps),
		}
		if e.name != "tapemachine" {
			r.SpeedupVsTM = tmMs / r.MsPerStep
		}
		if *asJSON {
			if err := writeJSONLine(os.Stdout, r); err != nil {
				return err
			}
			continue
		}
		label := e.name
		if e.workers > 0 {
			label = fmt.Sprintf("%s workers=%d", e.name, e.workers)
		}
		fmt.Printf("%-20s median %8.2f ms/step (mean %8.2f, cpu %8.2f)  %6.0f allocs/step  %10.0f B/step",
			label, r.MsPerStep, r.MeanMs, r.CPUMsStep, r.AllocsStep, r.BytesStep)
		if r.SpeedupVsTM > 0 {
			fmt.Printf("  %.2fx TapeMachine", r.SpeedupVsTM)
		}
		fmt.Println()
	}
	return nil
}

type benchEngine struct {
	name    string
	workers int
	step    func() error

	steps          int
	times          []time.Duration
	cpu            time.Duration
	mallocs, bytes uint64
}

func (e *benchEngine) timedStep() error {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	c0 := cputime.Process()
	t0 := time.Now()
	err := e.step()
	e.times = append(e.times, time.Since(t0))
	e.cpu += cputime.Process() - c0
	runtime.ReadMemStats(&b)
	e.mallocs += b.Mallocs - a.Mallocs
	e.bytes += b.TotalAlloc - a.TotalAlloc
	e.steps++
	return err
}

// msPerStep is the median step time.
func (e *benchEngine) msPerStep() float64 {
	return float64(quantile(e.times, 0.5).Microseconds()) / 1e3
}

func (e *benchEngine) meanMs() float64 {
	var sum time.Duration
	for _, d := range e.times {
		sum += d
	}
	return float64(sum.Microseconds()) / 1e3 / float64(len(e.times))
}

func (e *benchEngine) cpuMs() float64 {
	return float64(e.cpu.Microseconds()) / 1e3 / float64(e.steps)
}

// mlpStep is an MLP with ReLU layers, a log-softmax cross-entropy cost and
// the gradients of its parameters, plus one batch of data.
type mlpStep struct {
	g             *G.ExprGraph
	x, y          *G.Node
	xv, yv        *tensor.Dense
	params, grads G.Nodes
}

func newMLPStep(sizes []int, batch int) (*mlpStep, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	randn := func(shape ...int) *tensor.Dense {
		n := 1
		for _, s := range shape {
			n *= s
		}
		b := make([]float32, n)
		for i := range b {
			b[i] = float32(rng.NormFloat64() * 0.05)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(b))
	}
	g := G.NewGraph()
	m := &mlpStep{g: g}
	classes := sizes[len(sizes)-1]
	m.x = G.NewMatrix(g, tensor.Float32, G.WithShape(batch, sizes[0]), G.WithName("x"))
	m.y = G.NewMatrix(g, tensor.Float32, G.WithShape(batch, classes), G.WithName("y"))
	m.xv = randn(batch, sizes[0])
	m.yv = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(batch, classes))
	for r := 0; r < batch; r++ {
		if err := m.yv.SetAt(float32(1), r, rng.IntN(classes)); err != nil {
			return nil, err
		}
	}
	h := m.x
	for l := 0; l+1 < len(sizes); l++ {
		w := G.NewMatrix(g, tensor.Float32, G.WithShape(sizes[l], sizes[l+1]), G.WithName(fmt.Sprintf("w%d", l)), G.WithValue(randn(sizes[l], sizes[l+1])))
		b := G.NewVector(g, tensor.Float32, G.WithShape(sizes[l+1]), G.WithName(fmt.Sprintf("b%d", l)), G.WithValue(randn(sizes[l+1])))
		m.params = append(m.params, w, b)
		z, err := G.Mul(h, w)
		if err != nil {
			return nil, err
		}
		if z, err = G.BroadcastAdd(z, b, nil, []byte{0}); err != nil {
			return nil, err
		}
		if l+2 < len(sizes) {
			if z, err = G.Rectify(z); err != nil {
				return nil, err
			}
		}
		h = z
	}
	logp, err := G.LogSoftMax(h)
	if err != nil {
		return nil, err
	}
	prod, err := G.HadamardProd(m.y, logp)
	if err != nil {
		return nil, err
	}
	ce, err := G.Sum(prod, 1)
	if err != nil {
		return nil, err
	}
	mean, err := G.Mean(ce)
	if err != nil {
		return nil, err
	}
	cost, err := G.Neg(mean)
	if err != nil {
		return nil, err
	}
	if m.grads, err = G.Grad(cost, m.params...); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *mlpStep) bind() error {
	if err := G.Let(m.x, m.xv); err != nil {
		return err
	}
	return G.Let(m.y, m.yv)
}

// sgd updates every parameter in place: w -= 0.01 * grad(i).
func (m *mlpStep) sgd(grad func(i int) G.Value) {
	for i, p := range m.params {
		w := p.Value().(*tensor.Dense).Float32s()
		g := grad(i).(*tensor.Dense).Float32s()
		for j := range w {
			w[j] -= 0.01 * g[j]
		}
	}
}
