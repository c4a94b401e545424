package comm

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/gob"
	"fmt"
)

// Object collectives move Go values encoded with encoding/gob: each value is
// encoded on its own (self-describing), so every rank decodes independently.
// Values whose interface fields hold concrete types need gob.Register, as
// gob always does. Each object collective runs two collectives of the group:
// a small header (every sender's encoded size or failure), then the payload,
// so that a value that does not encode, or that exceeds the group's
// WithMaxObjectSize, fails the call on every rank instead of hanging the ones
// waiting for it. The limit is enforced by the rank that encodes; give every
// rank the same limit.

const (
	objOK         = 0
	objBadEncode  = 1
	objTooLarge   = 2
	objHeaderSize = 16 // status, length: two int64
)

// encodeObject gob-encodes v, returning the header status for peers and the
// local error.
func encodeObject[T any](pg *ProcessGroup, v T) ([]byte, int64, error) {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(&v); err != nil {
		return nil, objBadEncode, fmt.Errorf("value of type %T cannot be gob-encoded: %w: %w", v, err, ErrInvalidArgument)
	}
	if int64(buf.Len()) > pg.opts.maxObjectSize {
		return nil, objTooLarge, fmt.Errorf("value of type %T encodes to %d bytes, over the group's limit of %d (WithMaxObjectSize): %w", v, buf.Len(), pg.opts.maxObjectSize, ErrTooLarge)
	}
	return buf.Bytes(), objOK, nil
}

func decodeObject[T any](b []byte, from int) (T, error) {
	var v T
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&v); err != nil {
		return v, fmt.Errorf("decoding rank %d's value as %T: %w: %w", from, v, err, ErrMismatch)
	}
	return v, nil
}

func putHeader(b []byte, status, n int64) {
	binary.LittleEndian.PutUint64(b[0:], uint64(status))
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
}

func getHeader(b []byte) (status, n int64) {
	return int64(binary.LittleEndian.Uint64(b[0:])), int64(binary.LittleEndian.Uint64(b[8:]))
}

// peerObjectError is the error a rank reports when another rank's value failed.
func peerObjectError(op string, rank int, status int64) error {
	if status == objTooLarge {
		return fmt.Errorf("%s: rank %d's value is over its size limit (WithMaxObjectSize); see that rank's error: %w", op, rank, ErrTooLarge)
	}
	return fmt.Errorf("%s: rank %d's value could not be gob-encoded; see that rank's error: %w", op, rank, ErrInvalidArgument)
}

// internal runs one collective of an object operation and waits for it.
func (pg *ProcessGroup) internal(ctx context.Context, desc string, run func(ctx context.Context, c *opCtx) error) error {
	return pg.start(ctx, collective{name: desc, desc: desc, run: run}).Wait(ctx)
}

// BroadcastObject sets *v on every rank to root's *v.
func BroadcastObject[T any](ctx context.Context, pg *ProcessGroup, v *T, root int) error {
	const op = "broadcast_object"
	if v == nil {
		return errorf(ErrInvalidArgument, "%s: v is a nil pointer", op)
	}
	if err := pg.usable(op); err != nil {
		return err
	}
	if err := pg.checkPeer(root, op+" root"); err != nil {
		return err
	}
	header := make([]byte, objHeaderSize)
	var payload []byte
	var localErr error
	if pg.rank == root {
		var status int64
		payload, status, localErr = encodeObject(pg, *v)
		putHeader(header, status, int64(len(payload)))
	}
	err := pg.internal(ctx, fmt.Sprintf("%s_header(root=%d)", op, root), func(ctx context.Context, c *opCtx) error {
		return broadcastTree(ctx, c, header, dtUint8, root)
	})
	if err != nil {
		return err
	}
	status, n := getHeader(header)
	if status != objOK {
		if localErr != nil {
			return fmt.Errorf("%s: %w", op, localErr)
		}
		return peerObjectError(op, root, status)
	}
	if pg.rank != root {
		payload = make([]byte, n)
	}
	err = pg.internal(ctx, fmt.Sprintf("%s_payload(root=%d,%d bytes)", op, root, n), func(ctx context.Context, c *opCtx) error {
		return broadcastTree(ctx, c, payload, dtUint8, root)
	})
	if err != nil || pg.rank == root {
		return err
	}
	out, err := decodeObject[T](payload, root)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	*v = out
	return nil
}

// exchangeHeaders all-gathers every rank's encoded size and status, returning
// them and the first failing rank's error.
func exchangeHeaders(ctx context.Context, pg *ProcessGroup, op string, status int64, payload []byte, localErr error) ([]int64, error) {
	n := len(pg.members)
	table := make([]byte, objHeaderSize*n)
	putHeader(table[objHeaderSize*pg.rank:], status, int64(len(payload)))
	err := pg.internal(ctx, op+"_header()", func(ctx context.Context, c *opCtx) error {
		return ringRun(ctx, c, splitBlocks(table, objHeaderSize, n), dtUint8, KindSum, n-1, 2*(n-1), nil)
	})
	if err != nil {
		return nil, err
	}
	sizes := make([]int64, n)
	for r := range n {
		st, sz := getHeader(table[objHeaderSize*r:])
		if st != objOK {
			if r == pg.rank {
				return nil, fmt.Errorf("%s: %w", op, localErr)
			}
			if localErr != nil {
				return nil, fmt.Errorf("%s: %w", op, localErr)
			}
			return nil, peerObjectError(op, r, st)
		}
		sizes[r] = sz
	}
	return sizes, nil
}

// AllGatherObject returns every rank's v, indexed by rank, on every rank.
func AllGatherObject[T any](ctx context.Context, pg *ProcessGroup, v T) ([]T, error) {
	const op = "all_gather_object"
	if err := pg.usable(op); err != nil {
		return nil, err
	}
	payload, status, localErr := encodeObject(pg, v)
	sizes, err := exchangeHeaders(ctx, pg, op, status, payload, localErr)
	if err != nil {
		return nil, err
	}
	n := len(pg.members)
	var total int64
	for _, s := range sizes {
		total += s
	}
	all := make([]byte, total)
	blocks := make([][]byte, n)
	var off int64
	for r, s := range sizes {
		blocks[r] = all[off : off+s]
		off += s
	}
	copy(blocks[pg.rank], payload)
	err = pg.internal(ctx, fmt.Sprintf("%s_payload(%d bytes)", op, total), func(ctx context.Context, c *opCtx) error {
		return ringRun(ctx, c, blocks, dtUint8, KindSum, n-1, 2*(n-1), nil)
	})
	if err != nil {
		return nil, err
	}
	out := make([]T, n)
	for r := range n {
		if out[r], err = decodeObject[T](blocks[r], r); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	return out, nil
}

// GatherObject returns, on root, every rank's v indexed by rank; on other
// ranks it returns nil.
func GatherObject[T any](ctx context.Context, pg *ProcessGroup, v T, root int) ([]T, error) {
	const op = "gather_object"
	if err := pg.usable(op); err != nil {
		return nil, err
	}
	if err := pg.checkPeer(root, op+" root"); err != nil {
		return nil, err
	}
	payload, status, localErr := encodeObject(pg, v)
	sizes, err := exchangeHeaders(ctx, pg, op, status, payload, localErr)
	if err != nil {
		return nil, err
	}
	n := len(pg.members)
	blocks := make([][]byte, n)
	if pg.rank == root {
		for r, s := range sizes {
			blocks[r] = make([]byte, s)
		}
		blocks[root] = payload
	}
	err = pg.internal(ctx, fmt.Sprintf("%s_payload(root=%d)", op, root), func(ctx context.Context, c *opCtx) error {
		if c.rank() != root {
			return c.send(ctx, root, 1, payload)
		}
		for r := range n {
			if r != root {
				if err := c.recv(ctx, r, 1, blocks[r]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil || pg.rank != root {
		return nil, err
	}
	out := make([]T, n)
	for r := range n {
		if out[r], err = decodeObject[T](blocks[r], r); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	return out, nil
}

// ScatterObject sets *out on every rank i to root's ins[i]. ins is used on
// root only (one value per rank).
func ScatterObject[T any](ctx context.Context, pg *ProcessGroup, out *T, ins []T, root int) error {
	const op = "scatter_object"
	if out == nil {
		return errorf(ErrInvalidArgument, "%s: out is a nil pointer", op)
	}
	if err := pg.usable(op); err != nil {
		return err
	}
	if err := pg.checkPeer(root, op+" root"); err != nil {
		return err
	}
	n := len(pg.members)
	// header: [status, failing index] then one size per rank.
	header := make([]byte, 8*(n+2))
	var payloads [][]byte
	var localErr error
	if pg.rank == root {
		if len(ins) != n {
			localErr = errorf(ErrInvalidArgument, "%s: ins has %d values; the group has %d ranks", op, len(ins), n)
			binary.LittleEndian.PutUint64(header, objBadEncode)
		} else {
			payloads = make([][]byte, n)
			for i, v := range ins {
				p, st, err := encodeObject(pg, v)
				if err != nil {
					localErr = fmt.Errorf("%s: ins[%d]: %w", op, i, err)
					binary.LittleEndian.PutUint64(header, uint64(st))
					binary.LittleEndian.PutUint64(header[8:], uint64(i))
					break
				}
				payloads[i] = p
				binary.LittleEndian.PutUint64(header[8*(i+2):], uint64(len(p)))
			}
		}
	}
	err := pg.internal(ctx, fmt.Sprintf("%s_header(root=%d)", op, root), func(ctx context.Context, c *opCtx) error {
		return broadcastTree(ctx, c, header, dtUint8, root)
	})
	if err != nil {
		return err
	}
	if st := int64(binary.LittleEndian.Uint64(header)); st != objOK {
		if localErr != nil {
			return localErr
		}
		return peerObjectError(op, root, st)
	}
	mine := make([]byte, binary.LittleEndian.Uint64(header[8*(pg.rank+2):]))
	err = pg.internal(ctx, fmt.Sprintf("%s_payload(root=%d)", op, root), func(ctx context.Context, c *opCtx) error {
		if c.rank() != root {
			return c.recv(ctx, root, 1, mine)
		}
		for r := range n {
			if r != root {
				if err := c.send(ctx, r, 1, payloads[r]); err != nil {
					return err
				}
			}
		}
		mine = payloads[root]
		return nil
	})
	if err != nil {
		return err
	}
	v, err := decodeObject[T](mine, root)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	*out = v
	return nil
}
