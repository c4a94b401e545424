//go:build !linux

package peercred

import (
	"context"
	"net"
)

// Challenge is one request that the peer prove which process it is. Only
// Linux has one; elsewhere NewChallenge fails with ErrUnsupported.
type Challenge struct{}

// NewChallenge returns ErrUnsupported: only Linux reports peer credentials
// as this package needs them.
func NewChallenge() (*Challenge, error) { return nil, ErrUnsupported }

// Offer returns nothing: there are no challenges here.
func (c *Challenge) Offer() []byte { return nil }

// Close does nothing.
func (c *Challenge) Close() error { return nil }

// Accept returns ErrUnsupported.
func (c *Challenge) Accept(ctx context.Context, conn net.Conn) (Cred, error) {
	return Cred{}, ErrUnsupported
}

// Prove returns ErrUnsupported.
func Prove(ctx context.Context, offer []byte, conn net.Conn) error { return ErrUnsupported }
