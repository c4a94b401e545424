package store

import (
	"context"
	"testing"
)

// BenchmarkDialHandshake measures a client's connection to a server with a
// token: dial, handshake, close.
func BenchmarkDialHandshake(b *testing.B) {
	srv, err := NewServer("127.0.0.1:0", WithLogger(quietLogger()), WithToken("bench-token"))
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(context.Background())
	defer srv.Close()
	ctx := context.Background()
	for b.Loop() {
		s, err := Dial(ctx, srv.Addr(), WithLogger(quietLogger()), WithToken("bench-token"))
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}
