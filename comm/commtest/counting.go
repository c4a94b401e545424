package commtest

import (
	"context"
	"sync/atomic"

	"github.com/tandemml/tandem/comm/transport"
)

// Counting returns a backend that connects inner's transports and adds the
// length of every message its ranks send to sent, so that a test can tell
// how much data went through the transport (none, for an all-reduce of
// comm's shared tensors). Its transports report transport.OneHost as
// inner's do.
func Counting(inner transport.Backend, sent *atomic.Int64) transport.Backend {
	return countingBackend{inner, sent}
}

type countingBackend struct {
	inner transport.Backend
	sent  *atomic.Int64
}

func (b countingBackend) Connect(ctx context.Context, cfg transport.Config) (transport.Transport, error) {
	tr, err := b.inner.Connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return countingTransport{tr, b.sent}, nil
}

type countingTransport struct {
	transport.Transport
	sent *atomic.Int64
}

func (t countingTransport) Send(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	t.sent.Add(int64(len(buf)))
	return t.Transport.Send(ctx, peer, tag, buf)
}

func (t countingTransport) OneHost() bool {
	oh, ok := t.Transport.(transport.OneHost)
	return ok && oh.OneHost()
}
