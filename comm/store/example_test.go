package store_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// Rank 0 embeds the TCP store server, the other ranks dial it; they
// rendezvous by counting themselves in and publishing their addresses.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const world = 3

	master, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken("job-42"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer master.Close() // also stops the embedded server

	var wg sync.WaitGroup
	for rank := 1; rank < world; rank++ {
		wg.Go(func() {
			s, err := store.NewTCP(ctx, master.Addr(), false, store.WithToken("job-42"))
			if err != nil {
				fmt.Println(err)
				return
			}
			defer s.Close()
			s.Set(ctx, fmt.Sprintf("addr/%d", rank), []byte(fmt.Sprintf("host%d:7000", rank)))
			s.Add(ctx, "joined", 1)
		})
	}
	wg.Wait()

	// Wait blocks until every rank has published its address.
	if err := master.Wait(ctx, []string{"addr/1", "addr/2"}, 10*time.Second); err != nil {
		fmt.Println(err)
		return
	}
	addrs, _ := master.MultiGet(ctx, []string{"addr/1", "addr/2"})
	joined, _ := master.Add(ctx, "joined", 0)
	fmt.Printf("%d joined: %s %s\n", joined, addrs[0], addrs[1])

	// A prefix store keeps one group's keys apart from another's.
	group := store.NewPrefix("group/7", master)
	group.Set(ctx, "leader", []byte("rank 0"))
	v, _ := master.Get(ctx, "group/7/leader")
	fmt.Println(string(v))
	// Output:
	// 2 joined: host1:7000 host2:7000
	// rank 0
}

// Ranks that share a machine can rendezvous through a file instead.
func ExampleNewFile() {
	ctx := context.Background()
	path := fmt.Sprintf("%s/tandem-example-%d", os.TempDir(), time.Now().UnixNano())
	a, _ := store.NewFile(path) // in practice: one per process
	b, _ := store.NewFile(path)
	defer os.Remove(path)
	defer a.Close()
	defer b.Close()

	go a.Set(ctx, "ready", []byte("yes"))
	v, err := b.Get(ctx, "ready") // polls the file until the key appears
	fmt.Println(string(v), err)
	// Output: yes <nil>
}
