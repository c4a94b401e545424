package comm

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/transport"
)

func init() { Register("shm", shm.Backend{}) }

var (
	backendsMu sync.RWMutex
	backends   = map[string]transport.Backend{}
)

// Register makes a backend available under name ("tcp", "local"), as
// database/sql drivers do. Backends call it from their package's init. It
// panics when name is empty, b is nil or name is taken, since that is a
// programming error found at start-up.
func Register(name string, b transport.Backend) {
	if name == "" || b == nil {
		panic("comm: Register needs a name and a non-nil backend")
	}
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if _, dup := backends[name]; dup {
		panic(fmt.Sprintf("comm: backend %q registered twice", name))
	}
	backends[name] = b
}

// Lookup returns the backend registered under name, or an error wrapping
// ErrInvalidArgument that lists the registered names (a backend registers
// itself when its package is imported, e.g. `import _ "github.com/tandemml/tandem/comm/tcp"`).
func Lookup(name string) (transport.Backend, error) {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	if b, ok := backends[name]; ok {
		return b, nil
	}
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("comm: no backend named %q (registered: %s); import the backend's package to register it: %w",
		name, strings.Join(names, ", "), ErrInvalidArgument)
}

// Backends returns the names of the registered backends, sorted.
func Backends() []string {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
