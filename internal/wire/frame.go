package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"slices"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/recvbuf"
)

// Wire format of one frame (all integers little-endian):
//
//	fixed header, 24 bytes:
//	  [0:4]   head length (u32): bytes of the head that follows
//	  [4:12]  data length (u64): bytes of raw tensor data after the head
//	  [12]    kind: 1 request, 2 response, 3 error, 4 cancel, 5 read-done,
//	          6 heartbeat, 7 grant, 8 revoke, 9 revoked
//	  [13]    code: error frames carry an error code, grants the sender's
//	          share (below), others 0
//	  [14]    version: 1
//	  [15]    flags: bit 0 "tensors by reference" (same-host copies); bit 1
//	          "no read-done frame" (requests by reference only: the caller
//	          waits for the reply, which tells it the copy is made); bit 2
//	          "pushed" (by reference only: the sender writes the tail of
//	          one tensor into granted memory itself); bit 3 "lent" (requests
//	          only: the caller lent memory for the reply, which is not to
//	          be pushed)
//	  [16:24] call id (u64); a grant's token for kinds 7 to 9
//	head:
//	  uvarint n, n bytes   function name (requests)
//	  uvarint n, n bytes   type name of the value carried
//	  uvarint              aux: a request's timeout in ns (0: none); an
//	                       error's sentinel mask
//	  uvarint m            metadata pairs, then m × (uvarint n, key, uvarint n, value)
//	  uvarint n, n bytes   payload: the value's encoding, tensors excepted
//	  uvarint t            tensors, then t × (dtype byte, uvarint ndim, ndim × uvarint dim,
//	                       and with flag bit 0: uvarint address in the sender)
//	  with flag bit 2: uvarint token, uvarint tensor index, uvarint cut
//	data: the tensors' bytes, one after another, in native little-endian
//	  element order; their sizes follow from dtype and shape and must add up
//	  to the data length. With flag bit 0 there is no data (length 0): the
//	  receiver copies each tensor from the sender's memory and answers with
//	  a read-done frame (kind 5, same id, empty), unless flag bit 1 is set.
//
// A heartbeat frame (kind 6, id 0, empty head fields, no data) goes both
// ways on a connection that has written nothing for the liveness interval;
// the receiver drops it, having counted its bytes as a sign of life (see
// WithLivenessTimeout). It came with the liveness check; frames before it
// end at kind 5, and both ends of a connection run the same build.
//
// Pushed tensors. A receiver that has copied a large tensor by reference
// may grant the sender memory for the next one (kind 7, the token in the
// id field, the size in aux, the payload the memory's address and the
// address of an 8-byte completion word, both u64, and in code the part of
// the tensor the sender is to write itself, in 256ths). The sender may then
// send a by-reference frame with flag bit 2, naming the token, a tensor
// that fits the memory and a cut: the receiver copies bytes [0, cut) of
// that tensor into the granted memory while the sender writes the rest
// there itself (process_vm_writev), then stores the token in the
// completion word; the two copies run at once, on two cores. A grant is
// used once. The receiver may take back a grant not yet used (kind 8,
// revoke, the token in the id field); the sender answers with kind 9
// (revoked, the same token) and never uses it after.
//
// A frame whose head does not parse exactly, whose sizes disagree, or whose
// length passes the connection's limit is malformed: the connection that
// carried it is closed, nothing else.
const (
	HeaderLen = 24
	Version   = 1

	KindRequest   = 1
	KindResponse  = 2
	KindError     = 3
	KindCancel    = 4
	KindReadDone  = 5
	KindHeartbeat = 6
	KindGrant     = 7
	KindRevoke    = 8
	KindRevoked   = 9

	FlagByRef  = 1
	FlagNoAck  = 2
	FlagPushed = 4
	FlagLent   = 8

	// GrantLen is the payload of a grant frame: the memory's address and
	// the completion word's.
	GrantLen = 16

	MaxNameLen   = 4096
	maxMetaPairs = 1024
	maxTensors   = 1 << 20
	maxDims      = 64
)

// Frame is one message.
type Frame struct {
	Kind  byte
	Code  byte
	Flags byte
	ID    uint64
	Fn    string // function name (requests)
	Type  string // type name of the value carried
	Aux   uint64 // a request's timeout in ns; an error's sentinel mask
	Meta  map[string]string
	// Payload is the value's encoding, tensors excepted (Encoder).
	Payload []byte
	// Tensors travel as raw sections after the head, in the order of the
	// encoder's table.
	Tensors []*tensor.Dense
	// Blocks: the receive buffers the tensors were given, to release early
	// (recvbuf.Release) when the function that takes them says it keeps
	// none.
	Blocks []recvbuf.Block
	// Push: with FlagPushed, which tensor the sender writes in part itself.
	Push Push
}

// Push names a pushed tensor (FlagPushed): the grant used and the
// tensor's index in the frame.
type Push struct {
	Token uint64
	Index uint64
}

// Landings is the receiving side of pushed tensors: the memory this side
// granted, and the copy that the receiver and the sender share.
type Landings interface {
	// Land returns the memory granted under token for a tensor of size
	// bytes and its receive buffer's block, or an error when no such grant
	// is outstanding or the tensor does not fit it.
	Land(token, size uint64) ([]byte, recvbuf.Block, error)
	// Receive fills raw, the memory Land returned for token, with the
	// tensor at the sender's address addr: the receiver copies it from the
	// start while the sender writes it from the end, and Receive returns
	// once every byte is in and the sender has stopped writing. A failed
	// copy out of the sender's memory is a *ProtocolError (Protocol).
	Receive(token uint64, raw []byte, addr uint64) error
}

// dtype codes on the wire.
var dtypeCodes = []tensor.Dtype{
	1: tensor.Float64, 2: tensor.Float32, 3: tensor.Int64, 4: tensor.Int32,
	5: tensor.Int16, 6: tensor.Int8, 7: tensor.Uint64, 8: tensor.Uint32,
	9: tensor.Uint16, 10: tensor.Uint8, 11: tensor.Bool, 12: tensor.Complex64,
	13: tensor.Complex128, 14: tensor.Int, 15: tensor.Uint,
}

// DtypeCode returns the wire code of dtype dt; ok is false for a dtype
// that cannot travel.
func DtypeCode(dt tensor.Dtype) (code byte, ok bool) {
	for i, d := range dtypeCodes {
		if i > 0 && d == dt {
			return byte(i), true
		}
	}
	return 0, false
}

// ProtocolError marks a malformed or oversized frame: the connection is
// closed, the agent keeps serving others.
type ProtocolError struct{ err error }

// Error returns the cause's text.
func (e *ProtocolError) Error() string { return e.err.Error() }

// Unwrap returns the cause (wrapping ErrMalformed or errs.TooLarge).
func (e *ProtocolError) Unwrap() error { return e.err }

// Protocol returns err as a *ProtocolError: the peer broke the protocol
// (it named memory that cannot be read, say), and its connection is to be
// closed.
func Protocol(err error) error { return &ProtocolError{err} }

// Malformed returns a *ProtocolError wrapping ErrMalformed.
func Malformed(format string, args ...any) error {
	return &ProtocolError{fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)}
}

// contiguous returns t itself when its backing bytes are exactly its elements
// in row-major order, else a materialized copy.
func contiguous(t *tensor.Dense) (*tensor.Dense, error) {
	if !t.RequiresIterator() && sameSize(t) {
		return t, nil
	}
	if m, ok := t.Materialize().(*tensor.Dense); ok && sameSize(m) {
		return m, nil
	}
	return nil, fmt.Errorf("%w: rpc: a tensor of shape %v holds %d bytes, not %d; pass a contiguous tensor", errs.InvalidArgument, t.Shape(), len(t.Header.Raw), tensorElems(t.Shape())*int(t.Dtype().Size()))
}

func sameSize(t *tensor.Dense) bool {
	return len(t.Header.Raw) == tensorElems(t.Shape())*int(t.Dtype().Size())
}

func tensorElems(shape tensor.Shape) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// AppendHead appends the fixed header and head of f to dst and returns it
// with the data length. Tensors in f must be contiguous (see contiguous).
func AppendHead(dst []byte, f *Frame) ([]byte, uint64, error) {
	start := len(dst)
	dst = append(dst, make([]byte, HeaderLen)...)
	dst = AppendString(dst, f.Fn)
	dst = AppendString(dst, f.Type)
	dst = binary.AppendUvarint(dst, f.Aux)
	dst = binary.AppendUvarint(dst, uint64(len(f.Meta)))
	for k, v := range f.Meta {
		dst = AppendString(dst, k)
		dst = AppendString(dst, v)
	}
	dst = binary.AppendUvarint(dst, uint64(len(f.Payload)))
	dst = append(dst, f.Payload...)
	dst = binary.AppendUvarint(dst, uint64(len(f.Tensors)))
	var data, refBytes uint64
	for _, t := range f.Tensors {
		code, ok := DtypeCode(t.Dtype())
		if !ok {
			return nil, 0, fmt.Errorf("%w: rpc: tensors of dtype %v cannot travel (supported: bool, ints, uints, floats, complex)", errs.InvalidArgument, t.Dtype())
		}
		dst = append(dst, code)
		shape := t.Shape()
		if t.IsScalar() {
			shape = nil
		}
		dst = binary.AppendUvarint(dst, uint64(len(shape)))
		for _, d := range shape {
			dst = binary.AppendUvarint(dst, uint64(d))
		}
		if f.Flags&FlagByRef != 0 {
			if len(t.Header.Raw) > 0 {
				dst = binary.AppendUvarint(dst, uint64(uintptr(unsafe.Pointer(&t.Header.Raw[0]))))
			} else {
				dst = binary.AppendUvarint(dst, 0)
			}
			refBytes += uint64(len(t.Header.Raw))
			continue
		}
		data += uint64(len(t.Header.Raw))
	}
	if f.Flags&FlagPushed != 0 {
		dst = binary.AppendUvarint(dst, f.Push.Token)
		dst = binary.AppendUvarint(dst, f.Push.Index)
	}
	head := len(dst) - start - HeaderLen
	if head > math.MaxUint32 {
		return nil, 0, fmt.Errorf("%w: rpc: message head of %d bytes", errs.TooLarge, head)
	}
	h := dst[start : start+HeaderLen]
	binary.LittleEndian.PutUint32(h[0:4], uint32(head))
	binary.LittleEndian.PutUint64(h[4:12], data)
	h[12], h[13], h[14], h[15] = f.Kind, f.Code, Version, f.Flags
	binary.LittleEndian.PutUint64(h[16:24], f.ID)
	return dst, data + refBytes, nil
}

// AppendString appends s with its uvarint length.
func AppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Buffers returns the buffers that make up f on the wire: head first,
// then each tensor's bytes, without copying them.
func Buffers(head []byte, f *Frame) net.Buffers {
	bufs := make(net.Buffers, 0, 1+len(f.Tensors))
	bufs = append(bufs, head)
	if f.Flags&FlagByRef != 0 {
		return bufs
	}
	for _, t := range f.Tensors {
		if len(t.Header.Raw) > 0 {
			bufs = append(bufs, t.Header.Raw)
		}
	}
	return bufs
}

// headDecoder reads the head's fields and remembers the first failure.
type headDecoder struct {
	b   []byte
	err error
}

func (d *headDecoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = Malformed("bad %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *headDecoder) bytes(what string, limit int) []byte {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return nil
	}
	if n > uint64(limit) || n > uint64(len(d.b)) {
		d.err = Malformed("%s of %d bytes (limit %d, %d left in head)", what, n, limit, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *headDecoder) byte(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = Malformed("head ends before %s", what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

type tensorDesc struct {
	dt    tensor.Dtype
	shape []int
	size  uint64 // bytes
	addr  uint64 // by-reference frames: where the bytes are in the sender
}

// parseHeader validates the fixed header and returns its lengths.
func parseHeader(h []byte, maxSize int64) (f Frame, headLen uint32, dataLen uint64, err error) {
	headLen = binary.LittleEndian.Uint32(h[0:4])
	dataLen = binary.LittleEndian.Uint64(h[4:12])
	f.Kind, f.Code, f.Flags = h[12], h[13], h[15]
	f.ID = binary.LittleEndian.Uint64(h[16:24])
	if h[14] != Version {
		return f, 0, 0, Malformed("frame version %d, this side speaks %d", h[14], Version)
	}
	if f.Flags&^(FlagByRef|FlagNoAck|FlagPushed|FlagLent) != 0 ||
		(f.Flags&FlagNoAck != 0 && (f.Flags&FlagByRef == 0 || f.Kind != KindRequest)) ||
		(f.Flags&FlagPushed != 0 && f.Flags&FlagByRef == 0) ||
		(f.Flags&FlagLent != 0 && f.Kind != KindRequest) {
		return f, 0, 0, Malformed("frame flags %#x on a frame of kind %d", f.Flags, f.Kind)
	}
	if f.Kind < KindRequest || f.Kind > KindRevoked {
		return f, 0, 0, Malformed("frame kind %d", f.Kind)
	}
	if f.Flags&FlagByRef != 0 && (dataLen != 0 || (f.Kind != KindRequest && f.Kind != KindResponse)) {
		return f, 0, 0, Malformed("a by-reference frame of kind %d with %d data bytes", f.Kind, dataLen)
	}
	if dataLen > uint64(maxSize) || uint64(headLen) > uint64(maxSize)-dataLen {
		return f, 0, 0, &ProtocolError{fmt.Errorf("%w: rpc: frame of %d bytes passes the limit of %d bytes (WithMaxMessageSize)", errs.TooLarge, uint64(headLen)+dataLen, maxSize)}
	}
	return f, headLen, dataLen, nil
}

// parseHead fills f from the head bytes and returns the tensors' layout.
// intern (may be nil) turns names into strings.
func parseHead(f *Frame, head []byte, dataLen uint64, maxSize int64, intern func([]byte) string) ([]tensorDesc, error) {
	byRef := f.Flags&FlagByRef != 0
	if byRef {
		// The tensors' bytes are not in the frame, but count toward the limit.
		dataLen = uint64(maxSize) - uint64(len(head))
	}
	d := headDecoder{b: head}
	if intern == nil {
		intern = func(b []byte) string { return string(b) }
	}
	f.Fn = intern(d.bytes("function name", MaxNameLen))
	f.Type = intern(d.bytes("type name", MaxNameLen))
	f.Aux = d.uvarint("aux")
	nmeta := d.uvarint("metadata count")
	if d.err == nil && nmeta > maxMetaPairs {
		d.err = Malformed("%d metadata pairs (limit %d)", nmeta, maxMetaPairs)
	}
	if d.err == nil && nmeta > 0 {
		f.Meta = make(map[string]string, nmeta)
		for i := uint64(0); i < nmeta && d.err == nil; i++ {
			k := d.bytes("metadata key", len(head))
			v := d.bytes("metadata value", len(head))
			f.Meta[string(k)] = string(v)
		}
	}
	f.Payload = d.bytes("payload", len(head))
	nt := d.uvarint("tensor count")
	if d.err == nil && (nt > maxTensors || nt > uint64(len(d.b))) {
		d.err = Malformed("%d tensors with %d head bytes left", nt, len(d.b))
	}
	var descs []tensorDesc
	var total uint64
	for i := uint64(0); i < nt && d.err == nil; i++ {
		code := d.byte("tensor dtype")
		if d.err != nil {
			break
		}
		if int(code) >= len(dtypeCodes) || code == 0 {
			d.err = Malformed("tensor %d has unknown dtype code %d", i, code)
			break
		}
		dt := dtypeCodes[code]
		ndim := d.uvarint("tensor rank")
		if d.err == nil && ndim > maxDims {
			d.err = Malformed("tensor %d has %d dimensions (limit %d)", i, ndim, maxDims)
		}
		if d.err != nil {
			break
		}
		shape := make([]int, ndim)
		elems := uint64(1)
		for j := range shape {
			dim := d.uvarint("tensor dimension")
			if d.err != nil {
				break
			}
			hi, lo := bits.Mul64(elems, dim)
			if hi != 0 || dim > math.MaxInt32*8 {
				d.err = Malformed("tensor %d shape overflows", i)
				break
			}
			elems = lo
			shape[j] = int(dim)
		}
		if d.err != nil {
			break
		}
		hi, size := bits.Mul64(elems, uint64(dt.Size()))
		if hi != 0 || size > dataLen-total {
			if byRef {
				d.err = &ProtocolError{fmt.Errorf("%w: rpc: tensors of a frame pass the limit of %d bytes (WithMaxMessageSize)", errs.TooLarge, maxSize)}
				break
			}
			d.err = Malformed("tensor %d of %v×%v needs more than the %d data bytes left", i, shape, dt, dataLen-total)
			break
		}
		total += size
		var addr uint64
		if byRef {
			addr = d.uvarint("tensor address")
		}
		descs = append(descs, tensorDesc{dt: dt, shape: shape, size: size, addr: addr})
	}
	if f.Flags&FlagPushed != 0 && d.err == nil {
		f.Push.Token = d.uvarint("push token")
		f.Push.Index = d.uvarint("pushed tensor")
		if d.err == nil && f.Push.Index >= uint64(len(descs)) {
			d.err = Malformed("pushed tensor %d, of %d tensors", f.Push.Index, len(descs))
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, Malformed("%d stray bytes at the end of the head", len(d.b))
	}
	if total != dataLen && !byRef {
		return nil, Malformed("tensors hold %d bytes, header says %d", total, dataLen)
	}
	switch f.Kind {
	case KindRequest:
		if f.Fn == "" {
			return nil, Malformed("request without a function name")
		}
	case KindCancel, KindReadDone, KindHeartbeat, KindRevoke, KindRevoked:
		if len(descs) != 0 || len(f.Payload) != 0 {
			return nil, Malformed("frame of kind %d with a body", f.Kind)
		}
	case KindGrant:
		if len(descs) != 0 || len(f.Payload) != GrantLen {
			return nil, Malformed("a grant with %d tensors and %d payload bytes", len(descs), len(f.Payload))
		}
	case KindError:
		if len(descs) != 0 {
			return nil, Malformed("error frame with tensors")
		}
	}
	return descs, nil
}

// ReadFrame reads one frame from r, receiving tensor data straight into the
// tensors' own backing arrays (for a by-reference frame, copying it with
// fetch; nil fetch refuses such frames). I/O errors come back as they are; a
// malformed or oversized frame yields a *ProtocolError.
//
// land receives a pushed tensor (FlagPushed) into the memory granted for it,
// fetching the part before the cut while the sender writes the rest; nil
// land refuses pushed frames.
//
// into, when not nil, offers memory for a by-reference frame's tensors: it
// returns the tensors a caller lent for the frame's call (WithResultInto),
// and a function to call once the copying into them is over, whether it
// succeeded or not. A lent tensor receives the frame's tensor of the same
// index when its dtype and shape match; others get new memory.
func ReadFrame(r io.Reader, hdr []byte, maxSize int64, intern func([]byte) string, fetch func(dst []byte, addr uint64) error, into func(id uint64) ([]*tensor.Dense, func()), land Landings) (*Frame, error) {
	if _, err := io.ReadFull(r, hdr[:HeaderLen]); err != nil {
		return nil, err
	}
	f, headLen, dataLen, err := parseHeader(hdr, maxSize)
	if err != nil {
		return nil, err
	}
	head := make([]byte, headLen)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, unexpectedEOF(err)
	}
	if f.Flags&FlagByRef != 0 && fetch == nil {
		return nil, Malformed("a by-reference frame on a connection without same-host copies")
	}
	if f.Flags&FlagPushed != 0 && land == nil {
		return nil, Malformed("a pushed frame on a connection that grants no memory")
	}
	descs, err := parseHead(&f, head, dataLen, maxSize, intern)
	if err != nil {
		return nil, err
	}
	if len(descs) > 0 {
		var lent []*tensor.Dense
		if into != nil && f.Flags&FlagByRef != 0 {
			var done func()
			if lent, done = into(f.ID); done != nil {
				defer done()
			}
		}
		f.Tensors = make([]*tensor.Dense, len(descs))
		for i, d := range descs {
			if f.Flags&FlagPushed != 0 && uint64(i) == f.Push.Index {
				t, err := receivePushed(&f, d, land)
				if err != nil {
					return nil, err
				}
				f.Tensors[i] = t
				continue
			}
			var t *tensor.Dense
			if i < len(lent) && fits(lent[i], d) && !slices.Contains(lent[:i], lent[i]) {
				t = lent[i]
			} else {
				var blk recvbuf.Block
				t, blk = recvbuf.NewTensor(d.dt, d.shape, d.size)
				if blk.Valid() {
					f.Blocks = append(f.Blocks, blk)
				}
			}
			raw := t.Header.Raw
			if uint64(len(raw)) != d.size {
				return nil, Malformed("tensor %d: %d bytes allocated for %d", i, len(raw), d.size)
			}
			if f.Flags&FlagByRef != 0 {
				if d.size > 0 {
					if err := fetch(raw, d.addr); err != nil {
						return nil, &ProtocolError{err}
					}
				}
			} else if _, err := io.ReadFull(r, raw); err != nil {
				return nil, unexpectedEOF(err)
			}
			f.Tensors[i] = t
		}
	}
	return &f, nil
}

// receivePushed receives the pushed tensor d of f into the memory granted
// for it, which the receiver and the sender fill together (Landings.Receive).
// An error leaves the granted memory with land, which must keep it from any
// other use.
func receivePushed(f *Frame, d tensorDesc, land Landings) (*tensor.Dense, error) {
	mem, blk, err := land.Land(f.Push.Token, d.size)
	if err != nil {
		return nil, &ProtocolError{err}
	}
	raw := mem[:d.size]
	if err := land.Receive(f.Push.Token, raw, d.addr); err != nil {
		return nil, err
	}
	if blk.Valid() {
		f.Blocks = append(f.Blocks, blk)
	}
	return recvbuf.TensorOn(d.dt, d.shape, raw), nil
}

// fits reports whether the lent tensor t can receive the tensor d
// describes: same dtype and shape, and memory of its own, whole and
// contiguous.
func fits(t *tensor.Dense, d tensorDesc) bool {
	if t == nil || t.Dtype() != d.dt || t.IsView() || t.RequiresIterator() || uint64(len(t.Header.Raw)) != d.size {
		return false
	}
	s := t.Shape()
	if len(s) != len(d.shape) {
		return false
	}
	for i := range s {
		if s[i] != d.shape[i] {
			return false
		}
	}
	return true
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// DecodeFrame decodes one whole frame from b, refusing frames over maxSize
// bytes and trailing bytes. It is the decoder the connections use, exposed
// for tests and tools.
func DecodeFrame(b []byte, maxSize int64, fetch func(dst []byte, addr uint64) error) (*Frame, error) {
	r := bytes.NewReader(b)
	f, err := ReadFrame(r, make([]byte, HeaderLen), maxSize, nil, fetch, nil, nil)
	if err != nil {
		return nil, err
	}
	if r.Len() != 0 {
		return nil, Malformed("%d bytes after the frame", r.Len())
	}
	return f, nil
}
