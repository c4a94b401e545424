package floodtest

import "syscall"

// ipBindAddressNoPort is IP_BIND_ADDRESS_NO_PORT: bind the local address
// but leave the port to connect, which can reuse a port that a closed
// connection to another address (or one in TIME_WAIT, on loopback) still
// holds. Without it each connection of a flood takes a port of its own from
// bind, and a second flood soon runs out.
const ipBindAddressNoPort = 24

func bindNoPort(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	})
	if err != nil {
		return err
	}
	return serr
}
