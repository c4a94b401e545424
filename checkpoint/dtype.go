package checkpoint

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

// dtypeInfo describes one safetensors dtype: its element size and the
// tensor dtype it decodes to.
type dtypeInfo struct {
	size int
	to   tensor.Dtype
}

// dtypes are the safetensors dtypes this package reads. F16 and BF16 have no
// gorgonia counterpart and decode to float32 (exactly: every half value is a
// float32 value); they are never written.
var dtypes = map[string]dtypeInfo{
	"F64":  {8, tensor.Float64},
	"F32":  {4, tensor.Float32},
	"F16":  {2, tensor.Float32},
	"BF16": {2, tensor.Float32},
	"I64":  {8, tensor.Int64},
	"I32":  {4, tensor.Int32},
	"I16":  {2, tensor.Int16},
	"I8":   {1, tensor.Int8},
	"U64":  {8, tensor.Uint64},
	"U32":  {4, tensor.Uint32},
	"U16":  {2, tensor.Uint16},
	"U8":   {1, tensor.Uint8},
	"BOOL": {1, tensor.Bool},
}

// fileDtype returns the safetensors name a tensor of dtype dt is written as.
// Go's int is written as I64 (it is 64 bits on every platform this project
// supports) and read back as int64.
func fileDtype(dt tensor.Dtype) (string, error) {
	switch dt {
	case tensor.Float64:
		return "F64", nil
	case tensor.Float32:
		return "F32", nil
	case tensor.Int64, tensor.Int:
		return "I64", nil
	case tensor.Int32:
		return "I32", nil
	case tensor.Int16:
		return "I16", nil
	case tensor.Int8:
		return "I8", nil
	case tensor.Uint64:
		return "U64", nil
	case tensor.Uint32:
		return "U32", nil
	case tensor.Uint16:
		return "U16", nil
	case tensor.Uint8:
		return "U8", nil
	case tensor.Bool:
		return "BOOL", nil
	}
	return "", fmt.Errorf("dtype %v has no safetensors encoding: %w", dt, errs.InvalidArgument)
}
