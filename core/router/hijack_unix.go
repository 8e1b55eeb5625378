// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router

import (
	"errors"
	"os"
	"syscall"
)

// hijackSupported: the watcher below notices a hang-up without net/http.
const hijackSupported = true

// watch waits for the client socket to become readable, holding no buffer
// (syscall.RawConn parks it in the netpoller), and reads nothing: a
// hang-up cuts the stream's engine work, the client's bytes stay for
// net/http (watched).
func (c *clientConn) watch() {
	c.watchFn = c.readable
	err := c.raw.Read(c.watchFn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Only an idle connection has a read deadline (end): the server's
		// idle timeout passed.
		c.idleTimedOut()
		return
	}
	c.watched(err == nil && c.hungUp, err == nil && c.bytes)
}

// readable is the watcher's callback: it peeks at one byte. End of file or
// an error is a hang-up (a half-close too, as net/http counts it); a byte
// is the client's next request (or a pipelined one); EAGAIN waits.
func (c *clientConn) readable(fd uintptr) bool {
	var b [1]byte
	for {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return false
		case err == nil && n > 0:
			c.bytes = true
			return true
		}
		c.hungUp = true
		return true
	}
}
