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
// read as float32).
//
// # Checksums
//
// Every file Tandem writes records a CRC-32C of its tensor data, tensor
// entries (names, dtypes, shapes, offsets) and other metadata in the
// metadata entry "tandem.checksum" (ChecksumKey), as "crc32c:" and 8 hex
// digits. It is an ordinary metadata string, so Python's safetensors and
// PyTorch read the files as before. Load and Decode verify it: a file whose
// bytes changed after it was written (a flipped bit, a tensor renamed in the
// header) gives an error wrapping ErrCorrupt that names the file. Files
// without the entry (written by PyTorch, other tools, or Tandem before
// checksums) load as before, unchecked; File.Checksum says which it was.
// CRC-32C runs at several GB/s: checking a 1.7 MB file costs about 0.1 ms
// next to 0.8 ms of decoding, and from 16 MB up Decode checks on another
// goroutine while it decodes, so that a 256 MB file, 115 ms to decode,
// costs hardly more with a second core free. Verify checks a file without
// decoding it.
//
// # Writing safely and resuming
//
// Files are written to a temporary file in the same folder and renamed, so
// a reader never sees a half-written checkpoint. The temporary file's name
// says which host and process writes it (see IsTemp); a process killed
// while saving leaves it behind, and the next Save into the folder (or
// CleanTemps) removes it once its process is gone, or after StaleTempAge
// without a write when it came from another host. A save under way is never
// disturbed.
//
// A job that resumes from its newest checkpoint lists its files newest
// first and calls NewestValid: a truncated or damaged newest file is
// skipped, with the reason, in favour of the newest intact one. Before
// saving, CheckFinite refuses tensors holding NaN or infinities, so that a
// diverged run does not write its ruined weights over the good ones.
package checkpoint
