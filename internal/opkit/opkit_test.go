package opkit

import (
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"strings"
	"testing"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

type named string

func (n named) String() string        { return string(n) }
func (n named) WriteHash(h hash.Hash) { fmt.Fprintf(h, "w:%s", string(n)) }

// TestKit: the constant answers, the two hashes (FNV-1a of WriteHash and of
// String, distinct for distinct ops), the arity check and its sentinel, and
// the types of a one-input op.
func TestKit(t *testing.T) {
	var p Plain
	if p.ReturnsPtr() || p.CallsExtern() || p.OverwritesInput() != -1 {
		t.Error("Plain's answers changed")
	}
	h := fnv.New32a()
	fmt.Fprint(h, "w:a")
	if Hash(named("a")) != h.Sum32() || Hash(named("a")) == Hash(named("b")) {
		t.Error("Hash is not the FNV-1a of WriteHash")
	}
	h = fnv.New32a()
	fmt.Fprint(h, "a")
	if HashString(named("a")) != h.Sum32() || HashString(named("a")) == HashString(named("b")) {
		t.Error("HashString is not the FNV-1a of String")
	}
	if d := AllDiff(3); len(d) != 3 || !d[0] || !d[1] || !d[2] {
		t.Errorf("AllDiff(3) = %v", d)
	}
	if err := CheckArity("pkg", named("op"), 2, 2); err != nil {
		t.Errorf("CheckArity with the right count: %v", err)
	}
	for _, c := range []struct {
		got, want int
		msg       string
	}{{2, 1, "pkg: op takes 1 input, got 2: "}, {1, 3, "pkg: op takes 3 inputs, got 1: "}} {
		err := CheckArity("pkg", named("op"), c.got, c.want)
		if !errors.Is(err, errs.InvalidArgument) || !strings.HasPrefix(err.Error(), c.msg) {
			t.Errorf("CheckArity(%d, %d) = %v, want %q... wrapping InvalidArgument", c.got, c.want, err, c.msg)
		}
	}
	u := Unary{In: TypeOf(2, tensor.Float64), Out: TypeOf(0, tensor.Float64)}
	if u.Arity() != 1 {
		t.Error("Unary's arity is not 1")
	}
	want := hm.NewFnType(G.TensorType{Dims: 2, Of: tensor.Float64}, tensor.Float64)
	if got := u.Type(); !got.Eq(want) {
		t.Errorf("Unary.Type = %v, want %v", got, want)
	}
}
