// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"net"
	"net/netip"
	"strconv"
)

// IsLoopback reports whether a listening address is reachable from this
// machine only (127.0.0.0/8, ::1, or an IPv4-mapped loopback address). The
// unspecified addresses 0.0.0.0 and :: are not: they listen everywhere.
func IsLoopback(a netip.AddrPort) bool {
	return a.Addr().Unmap().IsLoopback()
}

// PortFree reports whether a TCP port can be bound on 127.0.0.1 now. The
// core's port leasing uses it; a free port may still be taken by someone
// else before the engine binds it.
func PortFree(port int) bool {
	if port <= 0 || port > 65535 {
		return false
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}
