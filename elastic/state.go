package elastic

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// State is what a live member sends a member that is behind (a newcomer, a
// restarted process, one whose last step did not commit) so that it becomes
// identical to the rest: the model's parameters and buffers, the optimizer's
// state, anything else the training loop keeps per replica. The step and
// the data position travel with it on their own (Progress).
type State interface {
	// MarshalState encodes the state.
	MarshalState() ([]byte, error)
	// UnmarshalState replaces the state with one MarshalState encoded on a
	// peer that built the same model.
	UnmarshalState([]byte) error
}

// ModuleState is the State of a models.Module and its optimizer: the
// module's state dict and the optimizer's State, each as a safetensors
// blob (package checkpoint), checksummed. opt may be nil.
func ModuleState(m models.Module, opt optim.Optimizer) State { return moduleState{m, opt} }

type moduleState struct {
	m   models.Module
	opt optim.Optimizer
}

func (s moduleState) MarshalState() ([]byte, error) {
	var buf bytes.Buffer
	buf.Write(make([]byte, 8))
	if err := checkpoint.Encode(&buf, checkpoint.StateTensors(s.m), nil); err != nil {
		return nil, fmt.Errorf("elastic: encoding the model: %w", err)
	}
	binary.LittleEndian.PutUint64(buf.Bytes()[:8], uint64(buf.Len()-8))
	if s.opt != nil {
		st := s.opt.State()
		names := make([]string, 0, len(st))
		for k := range st {
			names = append(names, k)
		}
		slices.Sort(names)
		named := make([]checkpoint.Named, len(names))
		for i, k := range names {
			named[i] = checkpoint.Named{Name: k, Tensor: st[k]}
		}
		if err := checkpoint.Encode(&buf, named, nil); err != nil {
			return nil, fmt.Errorf("elastic: encoding the optimizer's state: %w", err)
		}
	}
	return buf.Bytes(), nil
}

func (s moduleState) UnmarshalState(b []byte) error {
	if len(b) < 8 {
		return fmt.Errorf("%w: elastic: a state of %d bytes is too short", errs.Mismatch, len(b))
	}
	n := binary.LittleEndian.Uint64(b[:8])
	if n > uint64(len(b)-8) {
		return fmt.Errorf("%w: elastic: the state's model part claims %d bytes of %d", errs.Mismatch, n, len(b)-8)
	}
	f, err := checkpoint.Decode(b[8 : 8+n])
	if err != nil {
		return fmt.Errorf("elastic: decoding the model from a peer: %w", err)
	}
	if err := checkpoint.CopyInto(s.m, f); err != nil {
		return fmt.Errorf("elastic: loading a peer's model: %w", err)
	}
	rest := b[8+n:]
	if s.opt == nil {
		return nil
	}
	if len(rest) == 0 {
		return fmt.Errorf("%w: elastic: the peer sent no optimizer state; it was built without an optimizer", errs.Mismatch)
	}
	g, err := checkpoint.Decode(rest)
	if err != nil {
		return fmt.Errorf("elastic: decoding the optimizer's state from a peer: %w", err)
	}
	if err := s.opt.LoadState(g.Map()); err != nil {
		return fmt.Errorf("elastic: loading a peer's optimizer state: %w", err)
	}
	return nil
}
