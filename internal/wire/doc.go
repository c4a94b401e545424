// Package wire is rpc's wire format, without sockets or agents: the
// framing of messages (Frame, AppendHead, ReadFrame) and the value codec
// that turns Go values into a frame's payload and tensor table and back
// (Encoder, Decoder, Codec).
//
// Everything here reads bytes from the network, so every decoder checks
// every length and count against what is left before it allocates, and
// fails with an error wrapping ErrMalformed (a *ProtocolError for a frame)
// rather than panicking; FuzzDecodeValue and FuzzDecodeFrame hold it to that.
package wire

import "errors"

// Sentinels of the wire format, re-exported by rpc (rpc.ErrMalformed,
// rpc.ErrWrongType).
var (
	// ErrWrongType: an argument or a result does not have the type the other
	// side expects.
	ErrWrongType = errors.New("rpc: wrong type")
	// ErrMalformed: bytes on the wire do not form a valid message.
	ErrMalformed = errors.New("rpc: malformed message")
)
