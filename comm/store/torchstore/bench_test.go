package torchstore

import (
	"context"
	"strconv"
	"testing"
)

// Round trips of a Go client against a Go server over loopback:
//
//	go test -run '^$' -bench . -benchtime 2000x ./comm/store/torchstore
func BenchmarkClient(b *testing.B) {
	srv, err := NewServer("", Unauthenticated())
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(context.Background())
	defer srv.Close()
	ctx := context.Background()
	c, err := Dial(ctx, srv.Addr())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	value := make([]byte, 64)
	b.Run("Set", func(b *testing.B) {
		for i := range b.N {
			if err := c.Set(ctx, "k"+strconv.Itoa(i%64), value); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Get", func(b *testing.B) {
		for i := range b.N {
			if _, err := c.Get(ctx, "k"+strconv.Itoa(i%64)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Add", func(b *testing.B) {
		for range b.N {
			if _, err := c.Add(ctx, "n", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AddParallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Add(ctx, "p", 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
