package torchstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
)

// Query types of the torch 1.13 protocol: the first byte of every request.
const (
	qSet        byte = 0
	qCompareSet byte = 1
	qGet        byte = 2
	qAdd        byte = 3
	qCheck      byte = 4
	qWait       byte = 5
	qNumKeys    byte = 6
	qWatchKey   byte = 7
	qDeleteKey  byte = 8
)

// Replies that are a single byte.
const (
	checkReady    byte = 0 // CHECK: every key exists
	checkNotReady byte = 1 // CHECK: some key is missing
	stopWaiting   byte = 0 // WAIT: every key exists now
)

// Kinds of the notifications sent on a connection that sent WATCH_KEY.
const (
	watchUpdated    byte = 0
	watchCreated    byte = 1
	watchDeleted    byte = 2
	watchRegistered byte = 3
)

// validateMagic is what a torch 2.x client sends right after its VALIDATE
// query (type 0 there), as the little-endian uint32 0x3C85F7CE. Under the
// 1.13 numbering that byte is SET, so the server recognises the magic in
// the place of a key length and names the version mismatch.
var validateMagic = [4]byte{0xCE, 0xF7, 0x85, 0x3C}

// queryName names a query type for messages.
func queryName(t byte) string {
	switch t {
	case qSet:
		return "SET"
	case qCompareSet:
		return "COMPARE_SET"
	case qGet:
		return "GET"
	case qAdd:
		return "ADD"
	case qCheck:
		return "CHECK"
	case qWait:
		return "WAIT"
	case qNumKeys:
		return "GETNUMKEYS"
	case qWatchKey:
		return "WATCH_KEY"
	case qDeleteKey:
		return "DELETE_KEY"
	}
	return fmt.Sprintf("unknown query type %d", t)
}

// query is one decoded request.
type query struct {
	typ byte
	// key of SET, COMPARE_SET, GET, ADD, WATCH_KEY, DELETE_KEY.
	key string
	// keys of CHECK and WAIT.
	keys []string
	// value of SET; the expected value of COMPARE_SET.
	value []byte
	// desired value of COMPARE_SET.
	desired []byte
	// delta of ADD.
	delta int64
}

// limits bound what the decoder accepts from a peer.
type limits struct {
	// maxValue bounds one key or value, and the total size of the keys of
	// one CHECK or WAIT.
	maxValue int
}

// errNewerClient: the peer opened with torch 2.x's VALIDATE query.
var errNewerClient = errors.New("the peer sent the VALIDATE query of torch 2.x (magic 0x3C85F7CE); " +
	"this server speaks torch 1.13's protocol, whose query numbers differ: use a torch 1.13 client, " +
	"or a torch 2.x TCPStore master instead of this server")

// errTooLarge: a declared length exceeds the limits.
var errTooLarge = errors.New("declared length over the limit")

// readChunk is the most the decoder allocates ahead of bytes that have
// arrived: a peer that declares a 64 MiB value but sends nothing costs 512
// bytes, one that sends half of it about 32 MiB plus this much.
const readChunk = 64 << 10

// decodeQuery reads one request. first is true for the first request of a
// connection (where a torch 2.x VALIDATE is recognised). Errors other than
// io.EOF before the first byte mean the stream cannot be resynchronised: the
// connection must be closed.
func decodeQuery(r *bufio.Reader, lim limits, first bool) (query, error) {
	var q query
	t, err := r.ReadByte()
	if err != nil {
		return q, err
	}
	q.typ = t
	switch t {
	case qSet:
		if first {
			if b, err := r.Peek(4); err == nil && [4]byte(b) == validateMagic {
				return q, errNewerClient
			}
		}
		if q.key, err = readString(r, lim, "key"); err != nil {
			return q, err
		}
		q.value, err = readBytes(r, lim, "value")
	case qCompareSet:
		if q.key, err = readString(r, lim, "key"); err != nil {
			return q, err
		}
		if q.value, err = readBytes(r, lim, "expected value"); err != nil {
			return q, err
		}
		q.desired, err = readBytes(r, lim, "desired value")
	case qGet, qWatchKey, qDeleteKey:
		q.key, err = readString(r, lim, "key")
	case qAdd:
		if q.key, err = readString(r, lim, "key"); err != nil {
			return q, err
		}
		var d uint64
		d, err = readUint64(r)
		q.delta = int64(d)
	case qCheck, qWait:
		q.keys, err = readKeys(r, lim)
	case qNumKeys:
	default:
		return q, fmt.Errorf("%s (torch 1.13 knows types 0 to 8; newer clients are not served)", queryName(t))
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return q, err
}

func readUint64(r *bufio.Reader) (uint64, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// readBytes reads a length-prefixed byte string, allocating as the bytes
// arrive rather than up front.
func readBytes(r *bufio.Reader, lim limits, what string) ([]byte, error) {
	n, err := readUint64(r)
	if err != nil {
		return nil, err
	}
	if n > uint64(lim.maxValue) {
		return nil, fmt.Errorf("%s of %d bytes, limit %d: %w", what, n, lim.maxValue, errTooLarge)
	}
	size := int(n)
	var buf []byte
	for len(buf) < size {
		// Read in pieces that double from 512 bytes up to readChunk, so
		// that memory follows what arrived, not what was announced.
		k := min(size-len(buf), max(len(buf), 512), readChunk)
		buf = slices.Grow(buf, k)
		start := len(buf)
		buf = buf[:start+k]
		if _, err := io.ReadFull(r, buf[start:]); err != nil {
			return nil, err
		}
	}
	return buf, nil
}

func readString(r *bufio.Reader, lim limits, what string) (string, error) {
	b, err := readBytes(r, lim, what)
	return string(b), err
}

// readKeys reads the key list of CHECK and WAIT: a uint64 count, then each
// key length-prefixed. The keys' total size is bounded by lim.maxValue.
func readKeys(r *bufio.Reader, lim limits) ([]string, error) {
	n, err := readUint64(r)
	if err != nil {
		return nil, err
	}
	// Every key costs at least its 8-byte length.
	if n > uint64(lim.maxValue/8) {
		return nil, fmt.Errorf("%d keys in one query, limit %d: %w", n, lim.maxValue/8, errTooLarge)
	}
	keys := make([]string, 0, min(int(n), 1024))
	total := 0
	for range n {
		left := limits{maxValue: lim.maxValue - total}
		k, err := readString(r, left, "key list")
		if err != nil {
			return nil, err
		}
		total += len(k) + 8
		keys = append(keys, k)
	}
	return keys, nil
}

// Encoding. Requests and replies are built in one buffer and written with one
// write.

func appendUint64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

func appendBytes(b, v []byte) []byte {
	b = appendUint64(b, uint64(len(v)))
	return append(b, v...)
}

func appendString(b []byte, s string) []byte {
	b = appendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// encodeQuery encodes q as a torch 1.13 client sends it.
func encodeQuery(q query) []byte {
	b := []byte{q.typ}
	switch q.typ {
	case qSet:
		b = appendString(b, q.key)
		b = appendBytes(b, q.value)
	case qCompareSet:
		b = appendString(b, q.key)
		b = appendBytes(b, q.value)
		b = appendBytes(b, q.desired)
	case qGet, qWatchKey, qDeleteKey:
		b = appendString(b, q.key)
	case qAdd:
		b = appendString(b, q.key)
		b = appendUint64(b, uint64(q.delta))
	case qCheck, qWait:
		b = appendUint64(b, uint64(len(q.keys)))
		for _, k := range q.keys {
			b = appendString(b, k)
		}
	}
	return b
}

// parseCounter reads a counter the way the torch 1.13 server's std::stoll
// does: leading white space, an optional sign, then at least one decimal
// digit; anything after the digits is ignored. ok is false when there is no
// number or it does not fit an int64.
func parseCounter(v []byte) (n int64, ok bool) {
	i := 0
	for i < len(v) && (v[i] == ' ' || (v[i] >= '\t' && v[i] <= '\r')) {
		i++
	}
	neg := false
	if i < len(v) && (v[i] == '+' || v[i] == '-') {
		neg = v[i] == '-'
		i++
	}
	start := i
	var u uint64
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		d := uint64(v[i] - '0')
		if u > (math.MaxUint64-d)/10 {
			return 0, false
		}
		u = u*10 + d
		i++
	}
	if i == start {
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return int64(-u), true
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}
