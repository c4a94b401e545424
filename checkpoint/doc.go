// Package checkpoint reads and writes safetensors files, the format PyTorch
// and Hugging Face use for state_dicts, so weights move both ways between
// Tandem and PyTorch with the same names and layouts (a Linear weight is
// [out, in]).
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON mapping each tensor name to {dtype, shape, data_offsets: [begin, end]}
// (plus an optional "__metadata__" object of strings), then the data buffer,
// row-major and little-endian, offsets relative to its start. Reading
// validates all of it strictly (ParseHeader); a malformed file gives an error
// wrapping ErrFormat that names the tensor at fault.
//
// Saving a model and loading it back:
//
//	err := checkpoint.SaveModule("mlp.safetensors", model, map[string]string{"format": "pt"})
//	...
//	err = checkpoint.LoadInto(model, "mlp.safetensors")          // strict, same dtypes
//	err = checkpoint.LoadInto(model, "mlp.safetensors", checkpoint.ConvertFloats())
//
// LoadInto checks every state_dict entry exists in the file with the model's
// shape and dtype (errors wrap ErrMismatch and say, for instance, "parameter
// 0.weight: shape [256 784] in file, [128 784] in model") before copying
// anything into the model's tensors in place.
//
// Plain tensors: Save / SaveMap / Encode write, Load / Decode read (F64, F32,
// I64, I32, I16, I8, U64, U32, U16, U8 and BOOL both ways; F16 and BF16 are
// read as float32). Files are written to a temporary file and renamed, so a
// reader never sees a half-written checkpoint.
package checkpoint
