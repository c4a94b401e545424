// Package metrics serves a process's training metrics at a Prometheus
// endpoint, in the text format that Prometheus and its client library read.
//
// It is opt-in: nothing is measured or served unless a program asks. The
// collectors read, on each scrape, what the other packages already record,
// so that serving metrics adds nothing to the hot paths:
//
//   - Group reads a process group's flight recorder (comm): per collective
//     kind (and for sends and receives, kinds send and recv), the
//     operations finished (by state), the bytes their tensors
//     hold (from the dtype and shape in each operation's fingerprint) and
//     histograms of those bytes and of the operations' latencies.
//     Operations that leave the recorder's ring between two scrapes are
//     counted in tandem_collective_ops_recorded_total but not in the
//     histograms: scrape more often than the ring fills, or enlarge it
//     with comm.WithFlightRecorder.
//   - DDP reads a data-parallel model's Stats (ddp): steps, the time spent
//     in steps, in their forward passes, their backward passes (and the
//     two together), in communication, the part of it hidden behind the
//     backward pass, the time spent waiting, buckets reduced and
//     overlapped, bytes sent and the straggler factor.
//   - RPC reads an agent's Metrics (rpc): calls and requests by outcome,
//     calls in flight and a summary of call latencies.
//   - Restarts reports how many times the launcher restarted the job's
//     workers (launch.Job.RestartCount).
//   - Store counts a TCP store client's operations by operation (set,
//     get, add, compare_set, wait, ...) and outcome, with a histogram of
//     their latencies. Unlike the others it is fed as the operations
//     happen: give it to the client as its store.Observer
//     (store.WithObserver, or comm.WithStoreOptions for the store that
//     comm.Init opens), which costs a clock reading and a counter update
//     per operation.
//
// Serve starts an HTTP server for a set of collectors, with the Go
// runtime's and the process's standard metrics beside them; Register adds
// them to a registry of the caller's own. `tandem run -metrics-addr
// HOST:PORT` hands each worker an address (the port plus its local rank)
// in TANDEM_METRICS_ADDR (launch.MetricsAddrEnv), which ServeFromEnv
// serves at when it is set.
//
// The endpoint has no authentication and tells anyone who can reach it
// about the job: bind it to loopback or to a network only the monitoring
// system reaches, not to every interface of a shared host.
//
// The cost falls on the scrape, not on training: a scrape copies the
// flight recorder's ring (comm.DefaultFlightRecorderSize operations per
// group) and reads the other counters under their locks; a scrape that
// finds 1000 new collectives takes about 3 ms on a 2-core machine, the Go
// runtime's and process's metrics included (BenchmarkScrape).
package metrics
