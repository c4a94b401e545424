package store

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
)

// benchOps runs a Set/Get/Add mix (25/50/25) from parallel goroutines, each
// on its own handle.
func benchOps(b *testing.B, handle func() Store) {
	ctx := context.Background()
	value := make([]byte, 64)
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		s := handle()
		prefix := "g" + strconv.FormatInt(next.Add(1), 10) + "/"
		if err := s.Set(ctx, prefix+"0", value); err != nil {
			b.Error(err)
			return
		}
		for j := 0; pb.Next(); j++ {
			var err error
			switch j % 4 {
			case 0:
				err = s.Set(ctx, prefix+strconv.Itoa(j%16), value)
			case 1, 3:
				_, err = s.Get(ctx, prefix+"0")
			case 2:
				_, err = s.Add(ctx, "counter", 1)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkMemory(b *testing.B) {
	m := NewMemory()
	defer m.Close()
	benchOps(b, func() Store { return m })
}

func BenchmarkTCP(b *testing.B) {
	srv, err := NewServer("127.0.0.1:0", WithLogger(quietLogger()), WithToken(""))
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(context.Background())
	defer srv.Close()
	var handles chanStores = make(chan Store, 1024)
	defer handles.closeAll()
	b.Run("conn-per-goroutine", func(b *testing.B) {
		benchOps(b, func() Store {
			s, err := Dial(context.Background(), srv.Addr(), WithLogger(quietLogger()), WithToken(""))
			if err != nil {
				b.Fatal(err)
			}
			handles <- s
			return s
		})
	})
	b.Run("shared-conn", func(b *testing.B) {
		s, err := Dial(context.Background(), srv.Addr(), WithLogger(quietLogger()), WithToken(""))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		benchOps(b, func() Store { return s })
	})
}

func BenchmarkFile(b *testing.B) {
	path := b.TempDir() + "/store"
	var handles chanStores = make(chan Store, 1024)
	defer handles.closeAll()
	benchOps(b, func() Store {
		s, err := NewFile(path)
		if err != nil {
			b.Fatal(err)
		}
		handles <- s
		return s
	})
}

type chanStores chan Store

func (c chanStores) closeAll() {
	close(c)
	for s := range c {
		s.Close()
	}
}
