package rpc

import (
	"sync"
	"unsafe"

	"github.com/tandemml/tandem/internal/wire"
)

// encoded is a value's encoding for one frame: made when the frame is
// written, or ahead of it when an interceptor asks which tensors the value
// carries (ClientCall.Tensors, ServerCall.ResultTensors), and then reused
// by the frame, so that the list an interceptor sees is the frame's own
// table and the value is encoded (and its Marshalers run) once.
type encoded struct {
	v   any // the value encoded, compared by identity (sameValue)
	enc wire.Encoder
	typ string
	err error
	buf *[]byte // pooled; the encoding's bytes
}

// encodeValue encodes v for worker to, seen from agent a.
func encodeValue(a *Agent, to WorkerInfo, v any) *encoded {
	e := &encoded{v: v, buf: getBuf()}
	e.enc = codec.NewEncoder((*e.buf)[:0], peerOf(a, to))
	e.typ, e.err = e.enc.EncodeTop(v)
	*e.buf = e.enc.Payload()
	return e
}

// abandon drops an encoding whose frame will not be written: what its
// Marshalers registered for the receiver is undone. A nil e does nothing.
func (e *encoded) abandon() {
	if e == nil {
		return
	}
	e.enc.Abandon()
	e.free()
}

// free returns the encoding's buffer once its frame is written or dropped.
func (e *encoded) free() {
	if e != nil && e.buf != nil {
		putBuf(e.buf)
		e.buf = nil
	}
}

// sameValue reports whether a and b are the same interface value: the same
// dynamic type and the same data word (the same pointer, or the same boxed
// copy). A value assigned anew is not the same, even when equal: it is
// encoded again, which is always right.
func sameValue(a, b any) bool {
	type eface struct{ typ, data unsafe.Pointer }
	return *(*eface)(unsafe.Pointer(&a)) == *(*eface)(unsafe.Pointer(&b))
}

// pending holds an encoding made ahead of its frame.
type pending struct {
	mu  sync.Mutex
	enc *encoded
}

// get returns the encoding of v for to, made now or earlier (when v is the
// very value encoded then; a stale one is abandoned), and keeps it for take.
func (p *pending) get(a *Agent, to WorkerInfo, v any) *encoded {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.enc != nil && !sameValue(p.enc.v, v) {
		p.enc.abandon()
		p.enc = nil
	}
	if p.enc == nil {
		p.enc = encodeValue(a, to, v)
	}
	return p.enc
}

// take hands the encoding of v to the frame that sends it, encoding v now
// when no encoding of it was made ahead.
func (p *pending) take(a *Agent, to WorkerInfo, v any) *encoded {
	p.mu.Lock()
	e := p.enc
	p.enc = nil
	p.mu.Unlock()
	if e != nil && sameValue(e.v, v) {
		return e
	}
	if e != nil {
		e.abandon()
	}
	return encodeValue(a, to, v)
}

// drop abandons an encoding made ahead that no frame took.
func (p *pending) drop() {
	p.mu.Lock()
	e := p.enc
	p.enc = nil
	p.mu.Unlock()
	if e != nil {
		e.abandon()
	}
}
