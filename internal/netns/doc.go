// Package netns makes separate "hosts" on one Linux machine out of network
// namespaces, for tests of multi-host training under network faults: a link
// cut, a short outage, a slow link, delay and loss.
//
// New(t, n) makes n namespaces, each with lo up and one veth pair (eth0
// inside the host) whose other end is enslaved to a Linux bridge in the root
// namespace; the bridge gets an
// address too, so a server in the test process (a store, say) is reachable
// from every host at RootAddr, and a fixed hardware address, so that a host
// added later does not change it under the running hosts' neighbour tables. Hosts reach each other over the bridge at
// layer 2 (IP forwarding stays off). Each network has its own /24, derived
// from the test process's pid and checked against every IPv4 address and
// route already on the machine; nothing outside the network's own namespaces,
// bridge and veth pairs is touched.
//
//	net := netns.New(t, 3)
//	cmd := net.Host(0).Command(ctx, os.Args[0], "-test.run=^TestHelperWorker$")
//	...
//	net.Host(0).CutFor(500 * time.Millisecond) // the link drops, and comes back
//
// Faults act on the root-namespace end of a host's veth pair, which is where a
// switch port would be: LinkDown takes it down, so the host keeps its address
// and routes but its packets go nowhere (connects and reads time out; nothing
// is refused or reset), and LinkUp brings it back, after which open TCP
// connections recover by retransmission. Traffic shaping (Netem, RateLimit)
// is installed as the root qdisc on both ends of the pair, so it applies in
// both directions; each call replaces the previous shaping, and ClearQdisc
// removes it.
//
// Processes run inside a host through Host.Command, which wraps
// `ip netns exec`. The namespace of a host is its network only: the file
// system, pids and users are shared with the test, but abstract unix sockets
// are per network namespace.
//
// What a kernel may lack: netem (sch_netem) is not in every kernel, and is
// not in the Firecracker guest kernel (6.18) that Tandem's CI runs on, where
// tc answers "Specified qdisc kind is unknown". Netem then returns an error
// wrapping ErrNoNetem, and NetemAvailable reports false, so that a test of
// delay or loss can skip itself by name. tbf and htb are there, so RateLimit
// works. That kernel has no tc classifiers and no iptables or nftables either,
// and the package uses none of them.
//
// New needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the `ip` tool; where
// namespaces cannot be made it skips the test with the reason, except when
// the environment has CI=true, where it fails the test instead. Everything
// New makes is removed by a t.Cleanup, including processes still running in a
// host. Names carry the test process's pid (namespaces
// "tandem-<pid>-<net>-h<i>", interfaces "tn<pid>_<net>b" and
// "tn<pid>_<net>v<i>"), and a process that has nets keeps a record (its pid
// and start time) in /run/tandem-netns, so that New first removes what
// recorded processes that died without cleaning up left behind, and nothing
// that no record names.
package netns
