package models_test

import (
	"fmt"
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// PairScorer is a model Tandem does not ship: it scores a (query, item) pair
// as q·M·iᵀ, with q and i the outputs of two towers. Embedding
// models.Container gives it Params, Buffers and a state_dict named as
// PyTorch names the same module's ("mix", "query.weight", "item.bias", ...).
type PairScorer struct {
	models.Container
	Mix         *models.Param
	Query, Item *models.Linear
}

// NewPairScorer builds the towers from queryIn and itemIn features to dim.
func NewPairScorer(queryIn, itemIn, dim int, rng *rand.Rand) (*PairScorer, error) {
	m := &PairScorer{}
	var err error
	if m.Mix, err = models.NewParam("mix", []int{dim, dim}, tensor.Float32, models.XavierUniform(1, rng)); err != nil {
		return nil, err
	}
	if m.Query, err = models.NewLinear(queryIn, dim, models.WithRand(rng)); err != nil {
		return nil, err
	}
	if m.Item, err = models.NewLinear(itemIn, dim, models.WithRand(rng)); err != nil {
		return nil, err
	}
	for _, err := range []error{m.AddParam(m.Mix), m.AddChild("query", m.Query), m.AddChild("item", m.Item)} {
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Forward is the one-input path models.Module asks for: the query tower.
func (m *PairScorer) Forward(b *models.Builder, q *G.Node) (*G.Node, error) {
	return m.Query.Forward(b, q)
}

// Score returns one score per row of the two inputs.
func (m *PairScorer) Score(b *models.Builder, q, item *G.Node) (*G.Node, error) {
	hq, err := m.Forward(b, q)
	if err != nil {
		return nil, err
	}
	hi, err := m.Item.Forward(b, item)
	if err != nil {
		return nil, err
	}
	mix, err := b.Node(m.Mix)
	if err != nil {
		return nil, err
	}
	qm, err := G.Mul(hq, mix)
	if err != nil {
		return nil, err
	}
	prod, err := G.HadamardProd(qm, hi)
	if err != nil {
		return nil, err
	}
	return G.Sum(prod, 1)
}

// A user-written two-input module with its own parameter and named
// children, a hand-written loss and an optimizer.
func Example_customModule() {
	model, err := NewPairScorer(3, 2, 4, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range models.StateDict(model) {
		fmt.Println(p.Name, p.Value.Shape(), p.Value.Dtype())
	}

	// A regression batch: two inputs and a float target.
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 16
	q, it, y := make([]float32, n*3), make([]float32, n*2), make([]float32, n)
	for r := range n {
		for j := range 3 {
			q[r*3+j] = float32(rng.NormFloat64())
		}
		for j := range 2 {
			it[r*2+j] = float32(rng.NormFloat64())
		}
		y[r] = q[r*3]*it[r*2] - q[r*3+1]*it[r*2+1]
	}
	b := models.NewBuilder(nil)
	qn := b.Bind("query", tensor.New(tensor.WithShape(n, 3), tensor.WithBacking(q)))
	in := b.Bind("item", tensor.New(tensor.WithShape(n, 2), tensor.WithBacking(it)))
	yn := b.Bind("y", tensor.New(tensor.WithShape(n), tensor.WithBacking(y)))
	score, _ := model.Score(b, qn, in)
	diff, _ := G.Sub(score, yn)
	sq, _ := G.Square(diff)
	loss, _ := G.Mean(sq) // the loss, written by hand
	if err := b.Backward(loss); err != nil {
		fmt.Println(err)
		return
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	opt, _ := optim.NewSGD(model.Params(), optim.LR(0.05), optim.Momentum(0.9))

	var first, last float32
	for step := range 300 {
		vm.Reset()
		if err := vm.RunAll(); err != nil {
			fmt.Println(err)
			return
		}
		_ = b.CopyGrads()
		_ = opt.Step()
		last = loss.Value().Data().(float32)
		if step == 0 {
			first = last
		}
	}
	fmt.Println(last < first/10)
	// Output:
	// mix (4, 4) float32
	// query.weight (4, 3) float32
	// query.bias (4) float32
	// item.weight (4, 2) float32
	// item.bias (4) float32
	// true
}

// A parameter drawn as nn.Linear draws its weight holds the values NewLinear
// would draw from a generator in the same state.
func ExampleNewParam() {
	w, err := models.NewParam("weight", []int{3, 5}, tensor.Float32, models.FanInUniform(5, rand.New(rand.NewPCG(7, 7))))
	if err != nil {
		fmt.Println(err)
		return
	}
	lin, _ := models.NewLinear(5, 3, models.WithRand(rand.New(rand.NewPCG(7, 7))))
	fmt.Println(w.Name, w.Value.Shape(), w.Value.Dtype(), w.RequiresGrad)
	fmt.Println(w.Value.Float32s()[4] == lin.Weight.Value.Float32s()[4])

	scale, _ := models.NewBuffer("scale", []int{2}, tensor.Float64, models.Constant(0.5))
	fmt.Println(scale.Value.Float64s(), scale.RequiresGrad)
	// Output:
	// weight (3, 5) float32 true
	// true
	// [0.5 0.5] false
}
