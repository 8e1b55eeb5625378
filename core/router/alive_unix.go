// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router

import (
	"net"
	"syscall"
)

// alive reports whether an idle pooled connection is still open and quiet:
// one non-blocking peek (a microsecond), which sees the FIN or reset of an
// engine that closed the connection after its last answer. A byte waiting
// on an idle connection is as bad: the engine sent something nobody asked
// for.
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	cerr := raw.Control(func(fd uintptr) {
		var b [1]byte
		for {
			_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if err == syscall.EINTR {
				continue
			}
			open = err == syscall.EAGAIN
			return
		}
	})
	return cerr == nil && open
}
