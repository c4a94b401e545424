package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
)

// A fingerprint frame is a fixed-size message that every member of a group
// sends to every other member for each collective:
//
//	[0:4]   sequence number (uint32, little endian)
//	[4]     1 when this rank's own arguments are invalid
//	[5:7]   length of the text (uint16)
//	[7:]    text: the collective's description, e.g. all_reduce(float32,[4],sum)
//
// A description too long for the frame is cut and ends in a hash of the whole,
// so that frames compare equal exactly when descriptions do.
const (
	fingerprintSize = 256
	fingerprintText = fingerprintSize - 7
)

func encodeFingerprint(seq uint32, op collective) []byte {
	f := make([]byte, fingerprintSize)
	binary.LittleEndian.PutUint32(f[0:4], seq)
	text := op.desc
	if op.invalid != nil {
		f[4] = 1
		text = op.desc + " with invalid arguments (" + op.invalid.Error() + ")"
	}
	if len(text) > fingerprintText {
		h := fnv.New64a()
		h.Write([]byte(text))
		suffix := fmt.Sprintf("...#%016x", h.Sum64())
		text = text[:fingerprintText-len(suffix)] + suffix
	}
	binary.LittleEndian.PutUint16(f[5:7], uint16(len(text)))
	copy(f[7:], text)
	return f
}

func fingerprintDesc(f []byte) string {
	n := int(binary.LittleEndian.Uint16(f[5:7]))
	if n > fingerprintText {
		n = fingerprintText
	}
	return string(f[7 : 7+n])
}

// exchangeFingerprints sends this rank's frame to every other member and
// receives theirs. It returns nil when all agree, an error wrapping
// ErrMismatch (the same text on every rank, naming both sides) when they do
// not, or the transport's error.
func (pg *ProcessGroup) exchangeFingerprints(ctx context.Context, c *opCtx, op collective, mine []byte) error {
	n, me := c.size(), c.rank()
	for i := 1; i < n; i++ {
		peer := (me + i) % n
		if err := c.send(ctx, peer, stepFinger, mine); err != nil {
			return fmt.Errorf("%s #%d: sending fingerprint: %w", op.desc, c.seq, err)
		}
	}
	frames := make([]byte, n*fingerprintSize)
	copy(frames[me*fingerprintSize:], mine)
	for peer := 0; peer < n; peer++ {
		if peer == me {
			continue
		}
		f := frames[peer*fingerprintSize : (peer+1)*fingerprintSize]
		if err := c.recv(ctx, peer, stepFinger, f); err != nil {
			if ctx.Err() != nil && !errors.Is(err, ErrPeerLost) {
				return fmt.Errorf("%w: %s #%d on group %q: rank %d never joined this collective (is it stuck, or did it call a different number of collectives?): %w",
					ErrTimeout, op.desc, c.seq, pg.name, peer, err)
			}
			return fmt.Errorf("%s #%d: waiting for rank %d's fingerprint: %w", op.desc, c.seq, peer, err)
		}
	}
	ref := frames[:fingerprintSize]
	for peer := 1; peer < n; peer++ {
		f := frames[peer*fingerprintSize : (peer+1)*fingerprintSize]
		if string(f) == string(ref) {
			continue
		}
		var odd []string
		for q := 1; q < n; q++ {
			if string(frames[q*fingerprintSize:(q+1)*fingerprintSize]) != string(ref) {
				odd = append(odd, fmt.Sprint(q))
			}
		}
		return fmt.Errorf("%w: collective #%d on group %q: rank 0 called %s but rank %d called %s (ranks differing from rank 0: %s; this is rank %d)",
			ErrMismatch, c.seq, pg.name, fingerprintDesc(ref), peer, fingerprintDesc(f), strings.Join(odd, ","), me)
	}
	return nil
}
