// Package rpctest holds the test helpers shared by the packages built on rpc
// (rref, autograd): starting a group of agents in one process over loopback
// sockets, shutting them all down, and waiting for a condition or for the
// goroutine count to settle. It is for tests only.
//
// A test starts a group, uses it, and lets the cleanup shut it down:
//
//	func TestSomething(t *testing.T) {
//		agents := rpctest.StartGroup(t, 2, func(reg *rpc.Registry) {
//			// register functions every agent serves
//		}, rpc.WithExtensions(rref.Extension()))
//		// ... calls between agents[0] and agents[1] ...
//		for i, err := range rpctest.ShutdownAll(agents) {
//			if err != nil {
//				t.Fatalf("shutdown %d: %v", i, err)
//			}
//		}
//	}
//
// rpc's own tests are internal to package rpc and keep their own copies: rpc
// cannot import this package without an import cycle.
package rpctest
