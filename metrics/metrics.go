package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/launch"
)

// Path is where Serve answers scrapes.
const Path = "/metrics"

// Register adds the collectors to reg. It fails if one of them is already
// there (two collectors over the same group's world, for example).
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if c == nil {
			continue
		}
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("metrics: register: %w (%w)", err, errs.InvalidArgument)
		}
	}
	return nil
}

// Serve listens on addr (HOST:PORT; port 0 picks one), serves the
// collectors, the Go runtime's and the process's metrics at Path, and
// returns the address it bound. The server stops when ctx is done.
func Serve(ctx context.Context, addr string, cs ...prometheus.Collector) (string, error) {
	reg := prometheus.NewRegistry()
	if err := Register(reg, append([]prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, cs...)...); err != nil {
		return "", err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics: serve: listening on %q: %w; give a free HOST:PORT", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "metrics: serve %s: %v\n", ln.Addr(), err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr().String(), nil
}

// ServeFromEnv serves the collectors, and Restarts from the launcher's
// variables, at the address in TANDEM_METRICS_ADDR (launch.MetricsAddrEnv,
// which `tandem run -metrics-addr` sets). It returns "" and no error when
// the variable is not set: metrics are opt-in.
func ServeFromEnv(ctx context.Context, cs ...prometheus.Collector) (string, error) {
	addr, ok := launch.MetricsAddr(os.LookupEnv)
	if !ok {
		return "", nil
	}
	job, err := launch.Read(os.LookupEnv)
	if err != nil {
		return "", fmt.Errorf("metrics: serve from env: %w", err)
	}
	return Serve(ctx, addr, append(cs, Restarts(job))...)
}

// Restarts reports job.RestartCount as the gauge tandem_restarts.
func Restarts(job launch.Job) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tandem_restarts",
		Help: "Times the launcher restarted this job's workers (0 on the first start)."})
	g.Set(float64(job.RestartCount))
	return g
}
