// Command rpc_parameter_server trains a linear regression model with a
// parameter server: one worker ("ps") owns the model, the others
// ("trainer1", ...) fetch it through a remote reference, compute gradients on
// their own data and push them back. See README.md.
//
//	go run ./examples/rpc_parameter_server                  # goroutine workers
//	tandem run -nproc 3 -- go run ./examples/rpc_parameter_server   # processes
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/rpc"
	"github.com/tandemml/tandem/rref"
	"gorgonia.org/tensor"
)

// Model sizes: y = W x + b with W [out, in] (PyTorch's Linear layout).
const (
	inDim  = 8
	outDim = 2
)

// ParameterServer owns the model. Trainers reach it through an
// *rref.RRef[*ParameterServer] and call its exported methods with rref.Call;
// the methods run on the server, so they lock.
type ParameterServer struct {
	mu      sync.Mutex
	w, b    *tensor.Dense
	lr      float64
	version int
}

// Snapshot is the model as a trainer fetches it.
type Snapshot struct {
	Version int
	W, B    *tensor.Dense
}

// Gradients is what a trainer pushes.
type Gradients struct {
	W, B *tensor.Dense
}

func newParameterServer(lr float64) *ParameterServer {
	return &ParameterServer{
		w:  tensor.New(tensor.WithShape(outDim, inDim), tensor.WithBacking(make([]float64, outDim*inDim))),
		b:  tensor.New(tensor.WithShape(outDim), tensor.WithBacking(make([]float64, outDim))),
		lr: lr,
	}
}

// Get returns a copy of the current parameters.
func (ps *ParameterServer) Get() Snapshot {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return Snapshot{Version: ps.version, W: ps.w.Clone().(*tensor.Dense), B: ps.b.Clone().(*tensor.Dense)}
}

// Push applies one SGD step with a trainer's gradients (asynchronous SGD:
// trainers push whenever they are done) and returns the new version.
func (ps *ParameterServer) Push(g Gradients) (int, error) {
	if !g.W.Shape().Eq(ps.w.Shape()) || !g.B.Shape().Eq(ps.b.Shape()) {
		return 0, fmt.Errorf("gradients of shapes %v, %v for parameters %v, %v", g.W.Shape(), g.B.Shape(), ps.w.Shape(), ps.b.Shape())
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	axpy(ps.w.Data().([]float64), g.W.Data().([]float64), -ps.lr)
	axpy(ps.b.Data().([]float64), g.B.Data().([]float64), -ps.lr)
	ps.version++
	return ps.version, nil
}

func axpy(dst, x []float64, a float64) {
	for i := range dst {
		dst[i] += a * x[i]
	}
}

// shard is one trainer's data: rows of x and their targets.
type shard struct {
	x [][inDim]float64
	y [][outDim]float64
}

// trueW and trueB are what the model should learn.
func truth() (w [outDim][inDim]float64, b [outDim]float64) {
	for o := range outDim {
		for i := range inDim {
			w[o][i] = float64((o+1)*(i%3)) - 1.5
		}
		b[o] = float64(o) + 0.5
	}
	return w, b
}

func makeShard(seed uint64, n int) shard {
	r := rand.New(rand.NewPCG(seed, 7))
	w, b := truth()
	s := shard{x: make([][inDim]float64, n), y: make([][outDim]float64, n)}
	for k := range n {
		for i := range inDim {
			s.x[k][i] = r.NormFloat64()
		}
		for o := range outDim {
			v := b[o] + 0.01*r.NormFloat64()
			for i := range inDim {
				v += w[o][i] * s.x[k][i]
			}
			s.y[k][o] = v
		}
	}
	return s
}

// lossAndGrads returns the mean squared error of the model on rows [lo, hi)
// and its gradients.
func (s shard) lossAndGrads(snap Snapshot, lo, hi int) (float64, Gradients) {
	w, b := snap.W.Data().([]float64), snap.B.Data().([]float64)
	gw, gb := make([]float64, len(w)), make([]float64, len(b))
	n := float64(hi - lo)
	var loss float64
	for k := lo; k < hi; k++ {
		for o := range outDim {
			pred := b[o]
			for i := range inDim {
				pred += w[o*inDim+i] * s.x[k][i]
			}
			d := pred - s.y[k][o]
			loss += d * d / n
			gb[o] += 2 * d / n
			for i := range inDim {
				gw[o*inDim+i] += 2 * d * s.x[k][i] / n
			}
		}
	}
	return loss, Gradients{
		W: tensor.New(tensor.WithShape(outDim, inDim), tensor.WithBacking(gw)),
		B: tensor.New(tensor.WithShape(outDim), tensor.WithBacking(gb)),
	}
}

type config struct {
	trainers int
	steps    int
	batch    int
	lr       float64
	verbose  bool
}

// registry holds the functions every worker serves.
func registry(cfg config) *rpc.Registry {
	reg := rpc.NewRegistry()
	// ps.model hands out a reference to the server's model; each trainer
	// that receives it holds a fork the server knows of.
	var once sync.Once
	var model *ParameterServer
	rpc.Register(reg, "ps.model", func(ctx context.Context, _ struct{}) (*rref.RRef[*ParameterServer], error) {
		once.Do(func() { model = newParameterServer(cfg.lr) })
		return rref.LocalRRef(rpc.AgentFromContext(ctx), model)
	})
	return reg
}

// runTrainer fetches the model reference, trains on its shard and returns
// its last loss.
func runTrainer(ctx context.Context, a *rpc.Agent, cfg config) (float64, error) {
	ps, err := rpc.Sync[*rref.RRef[*ParameterServer]](ctx, a, "ps", "ps.model", struct{}{})
	if err != nil {
		return 0, err
	}
	defer ps.Release(ctx)
	data := makeShard(uint64(a.Self().ID), 64*cfg.batch)
	var loss float64
	for step := range cfg.steps {
		snap, err := rref.Call[Snapshot](ctx, ps, "Get")
		if err != nil {
			return 0, fmt.Errorf("fetching the model: %w", err)
		}
		lo := (step * cfg.batch) % len(data.x)
		var g Gradients
		loss, g = data.lossAndGrads(snap, lo, lo+cfg.batch)
		version, err := rref.Call[int](ctx, ps, "Push", g)
		if err != nil {
			return 0, fmt.Errorf("pushing gradients: %w", err)
		}
		if cfg.verbose && step%10 == 0 {
			fmt.Printf("%s step %3d  model v%-4d  loss %.5f\n", a.Self().Name, step, version, loss)
		}
	}
	return loss, nil
}

// runWorker is one worker's whole life: rank 0 serves the model, the others
// train; every worker ends with a graceful shutdown, which waits for the
// whole group: the server calls it at once and waits there, under ctx, for
// as long as the trainers train (a trainer that dies ends it within
// seconds, naming the trainer).
func runWorker(ctx context.Context, a *rpc.Agent, cfg config) (float64, error) {
	var loss float64
	var err error
	if a.Self().ID != 0 {
		loss, err = runTrainer(ctx, a, cfg)
	}
	if serr := a.Shutdown(ctx); serr != nil {
		err = errors.Join(err, serr)
	}
	return loss, err
}

func workerName(rank int) string {
	if rank == 0 {
		return "ps"
	}
	return "trainer" + strconv.Itoa(rank)
}

// runGoroutines runs the server and the trainers as goroutine workers of
// this process, over loopback sockets, and returns the trainers' last
// losses.
func runGoroutines(ctx context.Context, cfg config) ([]float64, error) {
	st := store.NewMemory()
	defer st.Close()
	world := cfg.trainers + 1
	losses := make([]float64, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := rpc.Init(ctx, workerName(r), r, world, rpc.WithStore(st), rpc.WithRegistry(registry(cfg)), rpc.WithExtensions(rref.Extension()))
			if err != nil {
				errs[r] = err
				return
			}
			losses[r], errs[r] = runWorker(ctx, a, cfg)
		}()
	}
	wg.Wait()
	return losses[1:], errors.Join(errs...)
}

func main() {
	var cfg config
	flag.IntVar(&cfg.trainers, "trainers", 2, "trainers (goroutine mode; under tandem run: nproc-1)")
	flag.IntVar(&cfg.steps, "steps", 100, "steps per trainer")
	flag.IntVar(&cfg.batch, "batch", 16, "rows per step")
	flag.Float64Var(&cfg.lr, "lr", 0.05, "learning rate")
	limit := flag.Duration("timeout", 0, "bound on the whole run (0: none; each call has the RPC default timeout)")
	flag.Parse()
	cfg.verbose = true
	ctx, cancel := context.WithCancel(context.Background())
	if *limit > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), *limit)
	}
	defer cancel()
	start := time.Now()
	var losses []float64
	var err error
	if os.Getenv("RANK") != "" {
		// One worker per process (tandem run, torchrun-style variables).
		var a *rpc.Agent
		rank, _ := strconv.Atoi(os.Getenv("RANK"))
		a, err = rpc.InitFromEnv(ctx, workerName(rank), rpc.WithRegistry(registry(cfg)), rpc.WithExtensions(rref.Extension()))
		if err == nil {
			var loss float64
			loss, err = runWorker(ctx, a, cfg)
			if rank != 0 {
				losses = []float64{loss}
			}
		}
	} else {
		losses, err = runGoroutines(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rpc_parameter_server:", err)
		os.Exit(1)
	}
	first := 1
	if rank, _ := strconv.Atoi(os.Getenv("RANK")); rank > 0 {
		first = rank
	}
	for i, l := range losses {
		if math.IsNaN(l) {
			fmt.Fprintln(os.Stderr, "rpc_parameter_server: loss is NaN; lower -lr")
			os.Exit(1)
		}
		fmt.Printf("final loss of %s: %.6f\n", workerName(first+i), l)
	}
	fmt.Printf("done in %v\n", time.Since(start).Round(time.Millisecond))
}
