package main

import (
	"fmt"
	"math/rand/v2"
	"sync"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
)

// Feature sizes of the two inputs.
const (
	userDim = 4 // features of a user
	itemDim = 3 // features of an item
)

// Recommender is a model Tandem does not ship: it predicts how much a user
// likes an item from two inputs, the user's features and the item's. Each
// input goes through a tower of its own (a Linear layer and tanh) into a
// space of dim dimensions, and the score is the bilinear form
// tanh(user·Uᵀ+b)·Mix·tanh(item·Iᵀ+c)ᵀ, with Mix a learnable matrix.
//
// Embedding models.Container gives it Params, Buffers and a state_dict
// named as PyTorch names the same torch.nn.Module: "mix", "user.weight",
// "user.bias", "item.weight", "item.bias".
type Recommender struct {
	models.Container
	Mix        *models.Param // (dim, dim)
	User, Item *models.Linear
}

// NewRecommender builds the model in dtype dt, drawing its initial weights
// from rng (as torch.nn.Linear and torch.nn.init.xavier_uniform_ draw them).
func NewRecommender(dim int, dt tensor.Dtype, rng *rand.Rand) (*Recommender, error) {
	m := &Recommender{}
	var err error
	if m.Mix, err = models.NewParam("mix", []int{dim, dim}, dt, models.XavierUniform(1, rng)); err != nil {
		return nil, err
	}
	if m.User, err = models.NewLinear(userDim, dim, models.WithDtype(dt), models.WithRand(rng)); err != nil {
		return nil, err
	}
	if m.Item, err = models.NewLinear(itemDim, dim, models.WithDtype(dt), models.WithRand(rng)); err != nil {
		return nil, err
	}
	// Registration order is state_dict order: own parameters first, then
	// the children, whose names get the child's name as a prefix.
	for _, err := range []error{m.AddParam(m.Mix), m.AddChild("user", m.User), m.AddChild("item", m.Item)} {
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Forward is the one-input method models.Module asks for. A Recommender
// has two inputs, so Forward does what one input allows: it embeds users
// (the user tower), which is what a retrieval index would store. Training
// goes through Score.
func (m *Recommender) Forward(b *models.Builder, user *G.Node) (*G.Node, error) {
	h, err := m.User.Forward(b, user)
	if err != nil {
		return nil, err
	}
	return G.Tanh(h)
}

// Score adds the model to b's graph for a batch of users (N, userDim) and
// items (N, itemDim) and returns one score per row, shape (N).
func (m *Recommender) Score(b *models.Builder, user, item *G.Node) (*G.Node, error) {
	hu, err := m.Forward(b, user)
	if err != nil {
		return nil, err
	}
	hi, err := m.Item.Forward(b, item)
	if err != nil {
		return nil, err
	}
	if hi, err = G.Tanh(hi); err != nil {
		return nil, err
	}
	mix, err := b.Node(m.Mix) // the graph node that holds m.Mix.Value itself
	if err != nil {
		return nil, err
	}
	um, err := G.Mul(hu, mix)
	if err != nil {
		return nil, err
	}
	prod, err := G.HadamardProd(um, hi)
	if err != nil {
		return nil, err
	}
	return G.Sum(prod, 1)
}

// Loss is the hand-written loss: the mean squared error of the scores plus
// an L2 penalty of weight decay on Mix alone,
//
//	loss = mean((score - target)²) + decay·Σ Mix²
//
// It returns the loss and its first term, to report.
func (m *Recommender) Loss(b *models.Builder, score, target *G.Node, decay float64) (loss, mse *G.Node, err error) {
	diff, err := G.Sub(score, target)
	if err != nil {
		return nil, nil, err
	}
	sq, err := G.Square(diff)
	if err != nil {
		return nil, nil, err
	}
	if mse, err = G.Mean(sq); err != nil {
		return nil, nil, err
	}
	mix, err := b.Node(m.Mix)
	if err != nil {
		return nil, nil, err
	}
	mix2, err := G.Square(mix)
	if err != nil {
		return nil, nil, err
	}
	norm, err := G.Sum(mix2)
	if err != nil {
		return nil, nil, err
	}
	var c *G.Node
	switch score.Dtype() {
	case tensor.Float32:
		c = G.NewConstant(float32(decay), G.WithName("decay"))
	case tensor.Float64:
		c = G.NewConstant(decay, G.WithName("decay"))
	default:
		return nil, nil, fmt.Errorf("custom_model: scores of dtype %v; want float32 or float64", score.Dtype())
	}
	pen, err := G.HadamardProd(c, norm)
	if err != nil {
		return nil, nil, err
	}
	loss, err = G.Add(mse, pen)
	return loss, mse, err
}

// graphs is the model built into one training graph for batches of a
// fixed size: its input nodes, named as the data set's fields, its loss,
// and the learnable nodes and their gradient nodes in state_dict order.
type graphs struct {
	b            *models.Builder
	loss, mse    *G.Node
	params       G.Nodes
	grads        G.Nodes
	user, item   *G.Node
	target, pred *G.Node
}

// build adds the model, the loss and the backward pass to a new graph, for
// batches of n examples. The input nodes are named "user", "item" and
// "target", the data set's field names, so a batch feeds them by name.
func build(m *Recommender, n int, dt tensor.Dtype, decay float64) (*graphs, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	b := models.NewBuilder(nil)
	g := &graphs{b: b}
	g.user = b.Bind("user", tensor.New(tensor.Of(dt), tensor.WithShape(n, userDim)))
	g.item = b.Bind("item", tensor.New(tensor.Of(dt), tensor.WithShape(n, itemDim)))
	g.target = b.Bind("target", tensor.New(tensor.Of(dt), tensor.WithShape(n)))
	var err error
	if g.pred, err = m.Score(b, g.user, g.item); err != nil {
		return nil, err
	}
	if g.loss, g.mse, err = m.Loss(b, g.pred, g.target, decay); err != nil {
		return nil, err
	}
	if err := b.Backward(g.loss); err != nil {
		return nil, err
	}
	// The learnable nodes in state_dict order, so that DDP's parameters
	// carry the module's names ("mix", "user.weight", ...).
	for _, p := range m.Params() {
		nd, err := b.Node(p)
		if err != nil {
			return nil, err
		}
		gn := b.GradNode(p)
		if gn == nil {
			return nil, fmt.Errorf("custom_model: the loss does not depend on parameter %q", p.Name)
		}
		g.params = append(g.params, nd)
		g.grads = append(g.grads, gn)
	}
	return g, nil
}

// buildMu serializes the building of graphs in this process. gorgonia
// keeps package-level constant nodes (the 1 that seeds every gradient)
// whose hash it computes lazily on first use, so goroutine ranks of one
// process (the tests) building graphs at the same moment would race on
// them. One rank per process, as tandem run starts them, never contends.
var buildMu sync.Mutex
