// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package takeover

import "syscall"

// Supported: the Watcher notices a hang-up without net/http here.
const Supported = true

// Watcher waits for a taken-over client socket to become readable,
// holding no buffer (syscall.RawConn parks it in the netpoller), and reads
// nothing. Its callback is bound once, so a wait allocates nothing.
type Watcher struct {
	fn         func(fd uintptr) bool
	hangUpOnly bool
	hungUp     bool
	bytes      bool
}

// Wait waits on raw until the client hangs up (end of file or an error, a
// half-close too, as net/http counts it), or, unless hangUpOnly, sends
// bytes (its next request, or a pipelined one), which stay in the socket.
// An error (the connection closed here, a read deadline) reports neither.
func (w *Watcher) Wait(raw syscall.RawConn, hangUpOnly bool) (hungUp, bytes bool, err error) {
	if w.fn == nil {
		w.fn = w.readable
	}
	w.hangUpOnly, w.hungUp, w.bytes = hangUpOnly, false, false
	if err := raw.Read(w.fn); err != nil {
		return false, false, err
	}
	return w.hungUp, w.bytes, nil
}

// readable peeks at one byte: end of file or an error is a hang-up, a byte
// the client's bytes, EAGAIN waits. Waiting for a hang-up only, the
// client's bytes are read and dropped (the connection closes after this
// answer): left in the socket, they would hide the end of file behind
// them.
func (w *Watcher) readable(fd uintptr) bool {
	var b [256]byte
	flags := syscall.MSG_PEEK | syscall.MSG_DONTWAIT
	p := b[:1]
	if w.hangUpOnly {
		flags, p = syscall.MSG_DONTWAIT, b[:]
	}
	for {
		n, _, err := syscall.Recvfrom(int(fd), p, flags)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return false
		case err == nil && n > 0 && w.hangUpOnly:
			continue
		case err == nil && n > 0:
			w.bytes = true
			return true
		}
		w.hungUp = true
		return true
	}
}
