package metrics_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/metrics"
)

// A rank serves its metrics; a scraper (Prometheus, here the client
// library's own parser) reads them back. A program launched by `tandem run
// -metrics-addr` calls metrics.ServeFromEnv instead, with the same
// collectors (metrics.DDP(net), metrics.RPC(agent) beside Group).
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // stops the server
	pgs, err := local.NewGroups(ctx, 1)
	if err != nil {
		panic(err)
	}
	pg := pgs[0]
	defer pg.Close()

	addr, err := metrics.Serve(ctx, "127.0.0.1:0", metrics.Group(pg))
	if err != nil {
		panic(err)
	}
	t := tensor.New(tensor.WithShape(256), tensor.Of(tensor.Float32))
	for range 3 {
		if err := pg.AllReduce(ctx, t, comm.Sum).Wait(ctx); err != nil {
			panic(err)
		}
	}

	resp, err := http.Get("http://" + addr + metrics.Path)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		panic(err)
	}
	fmt.Println("all_reduce bytes:", fams["tandem_collective_bytes_total"].GetMetric()[0].GetCounter().GetValue())
	fmt.Println("all_reduce latencies observed:", fams["tandem_collective_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount())
	// Output:
	// all_reduce bytes: 3072
	// all_reduce latencies observed: 3
}
