package launch

import (
	"fmt"
	"net"
	"strconv"

	"github.com/tandemml/tandem/internal/errs"
)

// MetricsAddrEnv holds the HOST:PORT at which a worker serves its metrics
// (see package metrics). `tandem run -metrics-addr HOST:PORT` sets it for
// each worker to HOST and PORT plus the worker's local rank; a worker
// started without it serves none.
const MetricsAddrEnv = "TANDEM_METRICS_ADDR"

// MetricsAddr returns the worker's metrics address from MetricsAddrEnv,
// and whether it is set (and not empty).
func MetricsAddr(lookup func(string) (string, bool)) (string, bool) {
	v, ok := lookup(MetricsAddrEnv)
	return v, ok && v != ""
}

// WorkerMetricsAddr is the metrics address of the worker with local rank
// localRank when the launcher was given base (HOST:PORT): the same host,
// at PORT+localRank. A base port of 0 stays 0, so that every worker picks
// a free port of its own.
func WorkerMetricsAddr(base string, localRank int) (string, error) {
	host, port, err := net.SplitHostPort(base)
	if err != nil {
		return "", fmt.Errorf("launch: metrics address %q: %w; give HOST:PORT (%w)", base, err, errs.InvalidArgument)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("launch: metrics address %q: port %q is not a number in 0-65535 (%w)", base, port, errs.InvalidArgument)
	}
	if p != 0 {
		p += localRank
		if p > 65535 {
			return "", fmt.Errorf("launch: metrics address %q: port %d for local rank %d is past 65535; give a lower port (%w)", base, p, localRank, errs.InvalidArgument)
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}
