package checkpoint

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/models"
)

// SaveModule writes m's state_dict (parameters and buffers, PyTorch names
// and layouts, state_dict order) to a safetensors file at path, atomically.
func SaveModule(path string, m models.Module, metadata map[string]string) error {
	return Save(path, StateTensors(m), metadata)
}

// StateTensors returns m's state_dict as Named tensors. The tensors are the
// module's own Values, not copies.
func StateTensors(m models.Module) []Named {
	sd := models.StateDict(m)
	out := make([]Named, len(sd))
	for i, p := range sd {
		out[i] = Named{Name: p.Name, Tensor: p.Value}
	}
	return out
}

// LoadOption configures LoadInto and CopyInto.
type LoadOption func(*loadConfig)

type loadConfig struct {
	convert   bool
	nonStrict bool
}

// ConvertFloats lets a float32 tensor in the file load into a float64
// parameter and the other way round (float64 to float32 rounds to nearest),
// and F16/BF16 tensors load into float32 or float64 parameters. Without it
// any dtype difference is an error.
func ConvertFloats() LoadOption { return func(c *loadConfig) { c.convert = true } }

// NonStrict tolerates tensors in the file that the model lacks and model
// entries the file lacks (these keep their values), like PyTorch's
// load_state_dict(strict=False). Shapes and dtypes of the entries both have
// must still agree.
func NonStrict() LoadOption { return func(c *loadConfig) { c.nonStrict = true } }

// LoadInto reads the safetensors file at path into m's parameters and
// buffers (see CopyInto).
func LoadInto(m models.Module, path string, opts ...LoadOption) error {
	f, err := Load(path)
	if err != nil {
		return err
	}
	if err := CopyInto(m, f, opts...); err != nil {
		return fmt.Errorf("%w (file %s)", err, path)
	}
	return nil
}

// CopyInto copies f's tensors into m's state_dict entries of the same name,
// in place (graph nodes bound to the values see the new values). Every entry
// must exist in the file with the same shape and dtype, and the file must
// hold nothing else, unless NonStrict / ConvertFloats relax this. Everything
// is checked before anything is copied, so on error m is unchanged.
func CopyInto(m models.Module, f *File, opts ...LoadOption) error {
	var c loadConfig
	for _, o := range opts {
		o(&c)
	}
	sd := models.StateDict(m)
	type pair struct {
		p   *models.Param
		src *tensor.Dense
	}
	var pairs []pair
	var missing []string
	want := map[string]bool{}
	for _, p := range sd {
		want[p.Name] = true
		src, ok := f.Get(p.Name)
		if !ok {
			missing = append(missing, p.Name)
			continue
		}
		if err := compatible(p, src, f.Dtypes[p.Name], c.convert); err != nil {
			return err
		}
		pairs = append(pairs, pair{p, src})
	}
	var unexpected []string
	for _, n := range f.Names() {
		if !want[n] {
			unexpected = append(unexpected, n)
		}
	}
	if !c.nonStrict && (len(missing) > 0 || len(unexpected) > 0) {
		var parts []string
		if len(missing) > 0 {
			parts = append(parts, "missing from the file: "+strings.Join(missing, ", "))
		}
		if len(unexpected) > 0 {
			parts = append(parts, "not in the model: "+strings.Join(unexpected, ", "))
		}
		return fmt.Errorf("checkpoint: state_dict mismatch: %s (use checkpoint.NonStrict() to load the common entries): %w", strings.Join(parts, "; "), ErrMismatch)
	}
	for _, pr := range pairs {
		if err := copyValues(pr.p.Value, pr.src); err != nil {
			return fmt.Errorf("checkpoint: parameter %s: %w", pr.p.Name, err)
		}
	}
	return nil
}

func shapeList(t *tensor.Dense) []int {
	if t.IsScalar() {
		return []int{}
	}
	return []int(t.Shape())
}

func compatible(p *models.Param, src *tensor.Dense, fileDt string, convert bool) error {
	if p.Value == nil {
		return fmt.Errorf("checkpoint: parameter %s has no value in the model: %w", p.Name, errs.InvalidArgument)
	}
	fs, ms := shapeList(src), shapeList(p.Value)
	if !slices.Equal(fs, ms) {
		return fmt.Errorf("checkpoint: parameter %s: shape %v in file, %v in model: %w", p.Name, fs, ms, ErrMismatch)
	}
	fd, md := src.Dtype(), p.Value.Dtype()
	if md == tensor.Int && fd == tensor.Int64 {
		return nil // Go int is written as I64
	}
	if fd == md && (fileDt != "F16" && fileDt != "BF16" || convert) {
		return nil
	}
	isFloat := func(dt tensor.Dtype) bool { return dt == tensor.Float32 || dt == tensor.Float64 }
	if convert && isFloat(fd) && isFloat(md) {
		return nil
	}
	hint := ""
	if isFloat(fd) && isFloat(md) {
		hint = " (use checkpoint.ConvertFloats() to convert)"
	}
	return fmt.Errorf("checkpoint: parameter %s: dtype %s in file, %v in model%s: %w", p.Name, fileDt, md, hint, ErrMismatch)
}

// copyValues copies src's elements into dst in place, converting between
// float32 and float64 and from int64 to int when needed.
func copyValues(dst, src *tensor.Dense) error {
	if dst.IsScalar() {
		v, err := convertElem(src.Get(0), dst.Dtype())
		if err != nil {
			return err
		}
		dst.Set(0, v)
		return nil
	}
	s := elems(src)
	switch d := dst.Data().(type) {
	case []float64:
		switch s := s.(type) {
		case []float64:
			copy(d, s)
		case []float32:
			for i, v := range s {
				d[i] = float64(v)
			}
		default:
			return fmt.Errorf("cannot copy %v into float64: %w", src.Dtype(), ErrMismatch)
		}
	case []float32:
		switch s := s.(type) {
		case []float32:
			copy(d, s)
		case []float64:
			for i, v := range s {
				d[i] = float32(v)
			}
		default:
			return fmt.Errorf("cannot copy %v into float32: %w", src.Dtype(), ErrMismatch)
		}
	case []int:
		s64, ok := s.([]int64)
		if !ok {
			return fmt.Errorf("cannot copy %v into int: %w", src.Dtype(), ErrMismatch)
		}
		for i, v := range s64 {
			d[i] = int(v)
		}
	default:
		if src.Dtype() != dst.Dtype() {
			return fmt.Errorf("cannot copy %v into %v: %w", src.Dtype(), dst.Dtype(), ErrMismatch)
		}
		if err := tensor.Copy(dst, src); err != nil {
			return err
		}
	}
	return nil
}

// convertElem converts one element to dtype dt (float32 and float64 both
// ways, int64 to int; otherwise the dtypes must agree).
func convertElem(v any, dt tensor.Dtype) (any, error) {
	switch x := v.(type) {
	case float64:
		if dt == tensor.Float32 {
			return float32(x), nil
		}
	case float32:
		if dt == tensor.Float64 {
			return float64(x), nil
		}
	case int64:
		if dt == tensor.Int {
			return int(x), nil
		}
	}
	if reflect.TypeOf(v) == dt.Type {
		return v, nil
	}
	return nil, fmt.Errorf("cannot copy a %T into %v: %w", v, dt, ErrMismatch)
}
