package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// The TCP store speaks length-prefixed frames over one TCP connection:
//
//	frame   = length:uint32 big-endian, payload (length bytes, 1 <= length <= max frame)
//	payload = op:u8 code:u8 id:uvarint num:varint
//	          nkeys:uvarint (len:uvarint bytes)*nkeys
//	          nvals:uvarint (len:uvarint bytes)*nvals
//
// Every message has this one layout; what the fields mean depends on op.
// Requests carry a client-chosen id that the reply (op opReply) echoes, so
// one connection carries many concurrent requests. num holds a delta, a
// timeout in milliseconds, a count or a boolean; code holds request flags or
// the reply's status.
//
// The connection starts with a handshake (version 2) in which both sides
// prove that they hold the token without sending it, by the challenge-response
// of internal/tokenauth (protocol name "tandem-store"):
//
//	client: hello     op hello, id session, num 2, keys [magic, "tokenauth"], vals [client nonce]
//	server: challenge op reply, code OK, id session, num 1 if the server has a token else 0, vals [server nonce]
//	client: proof     op hello, id session, num 2, vals [client MAC] (no vals: the client has no token)
//	server: verdict   op reply, code OK, id session, vals [server MAC]
//
// Either MAC binds the version, the session id and the server's token flag.
// The server refuses with a reply carrying an error code and a message
// instead of the challenge (a hello of another version: codeInvalid) or the
// verdict (a proof that does not verify, or none: codeUnauthorized); a server
// without a token accepts any client. A client with a token refuses a server
// without one, or one whose MAC does not verify, since either may be an
// impostor. Nothing else is sent before the verdict.
//
// Version 1 sent the token itself as the hello's second key. The hello keeps
// two keys and its version in num so that a server of either version reaches
// its version check and answers the other with "protocol version" refusal.
//
// A client that reconnects says hello with the same session id; the server
// then drops the session's older connection and answers repeated flagOnce
// requests from its memory of their replies.

const (
	frameHeader   = 4
	frameOverhead = 1 << 10
	protoMagic    = "tandem-store"
	protoVersion  = 2 // 2: the token is proved by challenge-response (internal/tokenauth), never sent
	authScheme    = "tokenauth"
)

// helloBind returns the bytes that both MACs of a handshake bind: the
// protocol version, the session id and whether the server has a token.
func helloBind(session uint64, serverHasToken bool) []byte {
	b := make([]byte, 0, 10)
	b = append(b, protoVersion)
	b = binary.BigEndian.AppendUint64(b, session)
	if serverHasToken {
		return append(b, 1)
	}
	return append(b, 0)
}

// Operations.
const (
	opHello byte = iota + 1
	opSet
	opGet
	opAdd
	opCompareSet
	opDeleteKey
	opNumKeys
	opCheck
	opWait
	opMultiSet
	opMultiGet
	opAppend
	opCancel // num: id of the blocking request to abandon; no reply
	opBye    // the client closes: the server forgets its session; no reply
	opReply  = 0x80
)

// Request flags (the code byte of a request).
const (
	// flagOnce asks the server to apply the request at most once per
	// session: a repeat of its id (sent again after a reconnect) gets the
	// remembered reply instead of running again.
	flagOnce byte = 1
)

// Reply status codes.
const (
	codeOK byte = iota
	codeTimeout
	codeClosed
	codeTooLarge
	codeInvalid
	codeUnauthorized
	codeFailed
	numCodes
)

// message is one decoded frame.
type message struct {
	op   byte
	code byte
	id   uint64
	num  int64
	keys []string
	vals [][]byte
}

var errMalformed = errors.New("malformed store frame")

// readFrame reads one frame from r and returns its payload, refusing frames
// longer than maxFrame (ErrTooLarge) before allocating them. A frame cut short
// yields io.ErrUnexpectedEOF; a clean end of stream before a frame, io.EOF.
func readFrame(r io.Reader, maxFrame int) ([]byte, error) {
	return readFrameChunked(r, maxFrame, frameChunk)
}

// readFrameChunked is readFrame allocating at most chunk bytes (then as many
// as have arrived) ahead of the bytes read.
func readFrameChunked(r io.Reader, maxFrame, chunk int) ([]byte, error) {
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 {
		return nil, fmt.Errorf("empty frame: %w", errMalformed)
	}
	if uint64(n) > uint64(maxFrame) {
		return nil, fmt.Errorf("frame of %d bytes exceeds the limit of %d: %w", n, maxFrame, ErrTooLarge)
	}
	// Grow the buffer as bytes arrive, so that a peer announcing a large frame
	// holds only as much memory as it actually sent.
	p := make([]byte, 0, min(int(n), chunk))
	for len(p) < int(n) {
		want := min(int(n)-len(p), max(len(p), chunk))
		p = slices.Grow(p, want)
		got, err := io.ReadFull(r, p[len(p):len(p)+want])
		p = p[:len(p)+got]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return p, nil
}

// frameChunk is how much of a frame readFrame allocates before its bytes arrive.
const frameChunk = 1 << 20

// decodeMessage parses a frame's payload. It never panics and never
// allocates more than the payload's size suggests; values alias p but with
// capacity clipped, so appending to one never clobbers another.
func decodeMessage(p []byte) (message, error) {
	var m message
	d := decoder{p: p}
	m.op = d.byte()
	m.code = d.byte()
	m.id = d.uvarint()
	m.num = d.varint()
	if nk := d.count(); nk > 0 {
		m.keys = make([]string, nk)
		for i := range m.keys {
			m.keys[i] = string(d.bytes())
		}
	}
	if nv := d.count(); nv > 0 {
		m.vals = make([][]byte, nv)
		for i := range m.vals {
			m.vals[i] = d.bytes()
		}
	}
	if d.err != nil {
		return message{}, d.err
	}
	if len(d.p) != 0 {
		return message{}, fmt.Errorf("%d trailing bytes: %w", len(d.p), errMalformed)
	}
	if !validOp(m.op) {
		return message{}, fmt.Errorf("unknown operation %d: %w", m.op, errMalformed)
	}
	if m.op == opReply && m.code >= numCodes {
		return message{}, fmt.Errorf("unknown reply status %d: %w", m.code, errMalformed)
	}
	return m, nil
}

func validOp(op byte) bool {
	return (op >= opHello && op <= opBye) || op == opReply
}

type decoder struct {
	p   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("truncated or invalid %s: %w", what, errMalformed)
	}
	d.p = nil
}

func (d *decoder) byte() byte {
	if len(d.p) < 1 {
		d.fail("header")
		return 0
	}
	b := d.p[0]
	d.p = d.p[1:]
	return b
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.p)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.p = d.p[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.p)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.p = d.p[n:]
	return v
}

// maxList bounds the keys (or values) of one message, so that a frame of
// tiny elements cannot make the decoder allocate many times its size.
const maxList = 1 << 20

// count reads a list length; every element takes at least one byte, so a
// count beyond the bytes left is a lie and is refused before allocating.
func (d *decoder) count() int {
	v := d.uvarint()
	if d.err != nil {
		return 0
	}
	if v > uint64(len(d.p)) || v > maxList {
		d.fail("list length")
		return 0
	}
	return int(v)
}

func (d *decoder) bytes() []byte {
	v := d.uvarint()
	if d.err != nil {
		return nil
	}
	if v > uint64(len(d.p)) {
		d.fail("byte string")
		return nil
	}
	b := d.p[:v:v]
	d.p = d.p[v:]
	return b
}

// appendFrame encodes m as a complete frame (length header included) at the
// end of dst.
func appendFrame(dst []byte, m *message) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, m.op, m.code)
	dst = binary.AppendUvarint(dst, m.id)
	dst = binary.AppendVarint(dst, m.num)
	dst = binary.AppendUvarint(dst, uint64(len(m.keys)))
	for _, k := range m.keys {
		dst = binary.AppendUvarint(dst, uint64(len(k)))
		dst = append(dst, k...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.vals)))
	for _, v := range m.vals {
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-frameHeader))
	return dst
}

// checkRequest reports whether m has the shape its operation needs; a
// request that does not is a protocol violation.
func checkRequest(m *message) error {
	want := func(nk, nv int) error {
		if (nk >= 0 && len(m.keys) != nk) || (nv >= 0 && len(m.vals) != nv) {
			return fmt.Errorf("operation %d with %d keys and %d values: %w", m.op, len(m.keys), len(m.vals), errMalformed)
		}
		return nil
	}
	switch m.op {
	case opSet, opAppend:
		return want(1, 1)
	case opGet, opAdd, opDeleteKey:
		return want(1, 0)
	case opCompareSet:
		return want(1, 2)
	case opNumKeys, opCancel, opBye:
		return want(0, 0)
	case opCheck, opWait, opMultiGet:
		return want(-1, 0)
	case opMultiSet:
		return want(-1, len(m.keys))
	default:
		return fmt.Errorf("operation %d is not a request: %w", m.op, errMalformed)
	}
}
