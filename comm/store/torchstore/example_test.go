package torchstore_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/torchstore"
)

// A server that PyTorch processes can use, and a Go client of it.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The protocol has no authentication: serving it is an explicit choice.
	srv, err := torchstore.NewServer("", torchstore.Unauthenticated())
	if err != nil {
		fmt.Println(err)
		return
	}
	go srv.Serve(ctx)
	defer srv.Close()
	// In Python: torch.distributed.TCPStore("127.0.0.1", port, is_master=False)
	c, err := torchstore.Dial(ctx, srv.Addr())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	c.Set(ctx, "greeting", []byte("hello"))
	v, _ := c.Get(ctx, "greeting")
	n, _ := c.Add(ctx, "count", 2)
	fmt.Println(string(v), n)
	// Output: hello 2
}

// A worker started by torchrun with TORCHELASTIC_USE_AGENT_STORE=True joins
// the agent's store with the key layout torch's own workers use.
func ExampleDial_torchrunAgentStore() {
	ctx := context.Background()
	addr := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	c, err := torchstore.Dial(ctx, addr, torchstore.CountIn())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	s := store.NewPrefix("/worker/attempt_"+os.Getenv("TORCHELASTIC_RESTART_COUNT"), c)
	_ = s // rendezvous through s
}
