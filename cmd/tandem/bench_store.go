package main

// `tandem bench store`: throughput and latency of the TCP store on loopback
// with 1 to hundreds of concurrent clients.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

func init() {
	benches["store"] = command{
		summary: "TCP store ops/s on loopback: tandem bench store [-clients 1,16,256] [-ops N] [-json]",
		run:     benchStore,
	}
}

// storeBenchResult is one line of `tandem bench store -json`.
type storeBenchResult struct {
	Bench     string  `json:"bench"`
	Clients   int     `json:"clients"`
	Ops       int     `json:"ops"`
	Seconds   float64 `json:"seconds"`
	OpsPerSec float64 `json:"ops_per_s"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
}

func benchStore(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tandem bench store", flag.ContinueOnError)
	clientsFlag := fs.String("clients", "1,16,256", "comma-separated `counts` of concurrent clients, one run each")
	ops := fs.Int("ops", 50000, "operations per run, shared among the clients")
	valueSize := fs.Int("value", 64, "value size in `bytes`")
	asJSON := fs.Bool("json", false, "print one JSON object per run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	counts, err := parseInts(*clientsFlag)
	if err != nil {
		return fmt.Errorf("-clients: %w", err)
	}
	if *ops < 1 || *valueSize < 0 {
		return errors.New("-ops must be positive and -value not negative")
	}
	if !*asJSON {
		fmt.Println("TCP store on loopback; each client has its own connection; mix: 50% Get, 25% Set, 25% Add")
	}
	for _, c := range counts {
		r, err := storeBenchRun(ctx, c, *ops, *valueSize)
		if err != nil {
			return err
		}
		if *asJSON {
			if err := writeJSONLine(os.Stdout, r); err != nil {
				return err
			}
		} else {
			fmt.Printf("clients %4d  ops %7d  %8.0f ops/s  p50 %7.1f µs  p99 %8.1f µs\n",
				r.Clients, r.Ops, r.OpsPerSec, r.P50us, r.P99us)
		}
	}
	return nil
}

// storeBenchRun starts a server and `clients` clients and times `ops`
// operations spread over them.
func storeBenchRun(ctx context.Context, clients, ops, valueSize int) (storeBenchResult, error) {
	quiet := store.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	token := store.WithToken("bench")
	srv, err := store.NewServer("127.0.0.1:0", quiet, token)
	if err != nil {
		return storeBenchResult{}, err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	defer func() {
		srv.Close()
		<-served
	}()
	conns := make([]store.Store, clients)
	for i := range conns {
		if conns[i], err = store.Dial(ctx, srv.Addr(), quiet, token); err != nil {
			return storeBenchResult{}, err
		}
		defer conns[i].Close()
	}
	value := make([]byte, valueSize)
	lat := make([][]time.Duration, clients)
	errc := make(chan error, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i, s := range conns {
		n := ops / clients
		if i < ops%clients {
			n++
		}
		wg.Go(func() {
			own := make([]time.Duration, 0, n)
			for j := range n {
				key := "c" + strconv.Itoa(i) + "/k" + strconv.Itoa(j%16)
				t0 := time.Now()
				var err error
				switch j % 4 {
				case 0:
					err = s.Set(ctx, key, value)
				case 1, 3:
					// Reads a key this client set at j&^3, so it never blocks.
					_, err = s.Get(ctx, "c"+strconv.Itoa(i)+"/k"+strconv.Itoa((j&^3)%16))
				case 2:
					_, err = s.Add(ctx, "counter", 1)
				}
				if err != nil {
					errc <- fmt.Errorf("client %d op %d: %w", i, j, err)
					return
				}
				own = append(own, time.Since(t0))
			}
			lat[i] = own
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return storeBenchResult{}, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	pct := func(p float64) float64 { return float64(quantile(all, p).Nanoseconds()) / 1e3 }
	return storeBenchResult{
		Bench: "store", Clients: clients, Ops: len(all), Seconds: elapsed.Seconds(),
		OpsPerSec: float64(len(all)) / elapsed.Seconds(), P50us: pct(0.5), P99us: pct(0.99),
	}, nil
}
