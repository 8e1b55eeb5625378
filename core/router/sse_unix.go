// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router

import (
	"io"
	"syscall"
)

// initRaw prepares reads that wait for the connection without a buffer.
func (s *sseReader) initRaw() {
	sc, ok := s.conn.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	s.raw = raw
	s.readFn = s.readRaw
}

// readConn reads what the connection has into the buffer. While nothing
// is pending it waits for the connection to become readable holding no
// buffer (readRaw gives it back on EAGAIN), and takes one only when there
// are bytes to read. The connection's read deadline and a Close end the
// wait as they end a Read.
func (s *sseReader) readConn() (int, error) {
	if s.raw == nil {
		return s.readPlain()
	}
	s.rn, s.rerr = 0, nil
	if err := s.raw.Read(s.readFn); err != nil {
		return 0, err
	}
	switch {
	case s.rerr != nil:
		return 0, s.rerr
	case s.rn == 0:
		return 0, io.EOF
	}
	return s.rn, nil
}

// readRaw is the callback of syscall.RawConn.Read: one read(2) into the
// buffer; false (wait for readability) on EAGAIN, after giving the buffer
// back when nothing is pending.
func (s *sseReader) readRaw(fd uintptr) bool {
	if s.buf == nil {
		s.acquire()
	}
	for {
		n, err := syscall.Read(int(fd), s.buf[s.end:])
		switch err {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if s.start == s.end {
				s.release()
			}
			return false
		}
		s.rn, s.rerr = max(n, 0), err
		return true
	}
}
