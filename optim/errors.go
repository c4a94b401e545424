package optim

import "github.com/tandemml/tandem/internal/errs"

// ErrInvalidArgument is wrapped by every error about a bad setting, a bad
// parameter (dtype, shape, layout) or a malformed state map.
var ErrInvalidArgument = errs.InvalidArgument
