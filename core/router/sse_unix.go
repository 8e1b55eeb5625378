// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"
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
	if s.low {
		return s.readLow()
	}
	for {
		s.rn, s.rerr = 0, nil
		err := s.raw.Read(s.readFn)
		if err == nil {
			break
		}
		if !s.rearm(err) {
			return 0, err
		}
	}
	s.reads++
	return s.readResult()
}

func (s *sseReader) readResult() (int, error) {
	switch {
	case s.rerr != nil:
		return 0, s.rerr
	case s.rn == 0:
		return 0, io.EOF
	}
	return s.rn, nil
}

// lowWater sets the connection's low-water mark (SO_RCVLOWAT) for the
// rest of an assembled answer from an engine that closes its connection
// after a stream: the kernel then wakes the reader for lowWaterBytes or
// for the engine's close, not for every event the engine writes (one
// wake-up per answer of a hundred tokens instead of one per few tokens).
// TCP connections only (a unix socket's poll ignores the mark).
func (s *sseReader) lowWater() bool {
	if _, ok := s.conn.(*net.TCPConn); !ok || s.raw == nil {
		return false
	}
	var serr error
	if err := s.raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, lowWaterBytes)
	}); err != nil || serr != nil {
		return false
	}
	s.low = true
	return true
}

// readLow is readConn with the low-water mark: it waits for a wake-up
// (lowWaterBytes pending, the engine's close, a cut) or lowWaterCheck,
// whichever comes first, and reads what is pending either way; once until
// passed with nothing pending it returns os.ErrDeadlineExceeded. Bytes
// read on the clock, at until too, mark the read clocked (learnClose);
// only the reads the kernel woke it for count in reads.
func (s *sseReader) readLow() (int, error) {
	clocked := false
	for {
		now := time.Now()
		d, last := now.Add(lowWaterCheck), false
		if !s.until.After(d) {
			d, last = s.until, true
		}
		_ = s.conn.SetReadDeadline(d)
		s.rn, s.rerr, s.first = 0, nil, true
		err := s.raw.Read(s.readFn)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			clocked = true
			if !last {
				continue
			}
			// The bound passed: bytes below the mark are output too, read
			// on the clock as a look's are (first: not a wake-up).
			got := false
			s.first = true
			if cerr := s.raw.Control(func(fd uintptr) { got = s.readRaw(fd) }); cerr != nil || !got {
				return 0, err
			}
		} else if err != nil {
			return 0, err
		}
		s.clocked = clocked && s.first
		if !s.first {
			s.reads++ // woken by the kernel: the mark, the engine's close
		}
		return s.readResult()
	}
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
			s.first = false
			return false
		}
		s.rn, s.rerr = max(n, 0), err
		return true
	}
}
