// Package store holds the key-value stores that ranks rendezvous through, with
// the semantics of PyTorch's c10d stores: a TCP store (server embedded in rank 0
// or standalone), a file store shared by several processes, an in-memory store
// and a prefix store that namespaces another.
//
// Every call takes a context. Calls that block (Get, Wait) return an error
// wrapping ErrTimeout when the context's deadline or the store's default timeout
// expires, whichever comes first.
package store
