package comm

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/storetest"
	"github.com/tandemml/tandem/comm/store/torchstore"
	"github.com/tandemml/tandem/internal/testkit"
)

// TestAgentStoreViewConformance: the view of torchrun's agent store that
// Init joins (a prefix of a TCPStore client that waits by polling) keeps the
// Store contract, as far as torch 1.13's protocol goes (no APPEND).
func TestAgentStoreViewConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() store.Store {
		srv, err := torchstore.NewServer("127.0.0.1:0", torchstore.Unauthenticated())
		require.NoError(t, err)
		storetest.Serve(t, srv)
		return func() store.Store {
			v, err := dialAgentStore(testkit.Context(t, 20*time.Second), srv.Addr(), agentStorePrefix(0), 0, "", 20*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
			require.NoError(t, err)
			t.Cleanup(func() { v.Close() })
			return v
		}
	}, storetest.WithoutAppend())
}
