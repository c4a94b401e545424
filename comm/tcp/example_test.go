package tcp_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/comm/transport"
)

// Two ranks, here goroutines of one process, connect through a shared store
// and exchange a message. Across processes the store would be a TCP store.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := store.NewMemory()
	defer st.Close()
	backend := tcp.NewBackend(tcp.WithHost("127.0.0.1"))

	var wg sync.WaitGroup
	for rank := 0; rank < 2; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr, err := backend.Connect(ctx, transport.Config{Rank: rank, Size: 2, Store: st, Token: "s3cret"})
			if err != nil {
				fmt.Println(err)
				return
			}
			defer tr.Close()
			const tag transport.Tag = 1
			if rank == 0 {
				if err := tr.Send(ctx, 1, tag, []byte("hello, rank 1")); err != nil {
					fmt.Println(err)
				}
				// Wait for the reply so that rank 1 has read everything before we close.
				ack := make([]byte, 2)
				if err := tr.Recv(ctx, 1, tag, ack); err != nil {
					fmt.Println(err)
				}
				return
			}
			buf := make([]byte, len("hello, rank 1"))
			if err := tr.Recv(ctx, 0, tag, buf); err != nil {
				fmt.Println(err)
				return
			}
			fmt.Printf("rank 1 got %q\n", buf)
			tr.Send(ctx, 0, tag, []byte("ok"))
		}()
	}
	wg.Wait()
	// Output: rank 1 got "hello, rank 1"
}
