package tcp

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/tandemml/tandem/comm/transport"
)

// BenchmarkExchange measures the transport alone: two ranks send each other
// a buffer in chunks at the same time (full duplex), as a ring step does.
func BenchmarkExchange(b *testing.B) {
	for _, chunk := range []int{64 << 10, 512 << 10, 4 << 20} {
		b.Run(fmt.Sprintf("64MiB/chunk=%d", chunk), func(b *testing.B) {
			ts := connectAll(b, 2, nil)
			const size = 64 << 20
			bufs := [2][2][]byte{{make([]byte, size), make([]byte, size)}, {make([]byte, size), make([]byte, size)}}
			ctx := context.Background()
			b.SetBytes(size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				for r := 0; r < 2; r++ {
					wg.Add(2)
					go func() {
						defer wg.Done()
						for off := 0; off < size; off += chunk {
							if err := ts[r].Send(ctx, 1-r, transport.Tag(i), bufs[r][0][off:off+chunk]); err != nil {
								b.Error(err)
								return
							}
						}
					}()
					go func() {
						defer wg.Done()
						for off := 0; off < size; off += chunk {
							if err := ts[r].Recv(ctx, 1-r, transport.Tag(i), bufs[r][1][off:off+chunk]); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			}
		})
	}
}

// BenchmarkPingPong measures one round trip of a small message.
func BenchmarkPingPong(b *testing.B) {
	for _, size := range []int{8, 4096} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			ts := connectAll(b, 2, nil)
			ctx := context.Background()
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, size)
				for i := 0; i < b.N; i++ {
					if err := ts[1].Recv(ctx, 0, 1, buf); err != nil {
						done <- err
						return
					}
					if err := ts[1].Send(ctx, 0, 2, buf); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			buf := make([]byte, size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := ts[0].Send(ctx, 1, 1, buf); err != nil {
					b.Fatal(err)
				}
				if err := ts[0].Recv(ctx, 1, 2, buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
