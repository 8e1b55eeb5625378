// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router

import "syscall"

// hijackSupported: the watcher below notices a hang-up without net/http.
const hijackSupported = true

// watch waits for the client socket to become readable, holding no buffer
// (syscall.RawConn parks it in the netpoller), and cuts the stream's engine
// work when the client hung up. It ends when the relay closes the
// connection.
func (c *clientConn) watch() {
	c.watchFn = c.readable
	if err := c.raw.Read(c.watchFn); err != nil || !c.hungUp {
		return // closed by the relay: the stream ended
	}
	c.gone.Store(true)
	c.q.cutter.cut(errClientGone)
}

// readable is the watcher's callback: end of file or an error is a
// hang-up (a half-close too, as net/http counts it); bytes are a pipelined
// request after a "Connection: close" answer, dropped; EAGAIN waits.
func (c *clientConn) readable(fd uintptr) bool {
	var b [64]byte
	for {
		n, err := syscall.Read(int(fd), b[:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return false
		case err == nil && n > 0:
			continue
		}
		c.hungUp = true
		return true
	}
}
