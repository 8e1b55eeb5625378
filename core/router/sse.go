// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// errTooLarge is an event larger than the chunk bound.
var errTooLarge = errors.New("sse event over the chunk bound")

// errChunkedCoding is a malformed chunked body.
var errChunkedCoding = errors.New("malformed chunked coding in the engine's answer")

// eventBufSize is the size of the pooled buffers the SSE relay reads into.
// A buffer is held only while bytes are pending; an idle stream holds none,
// so the size costs nothing per open stream.
const eventBufSize = 8 << 10

var eventBufPool = sync.Pool{New: func() any { b := make([]byte, eventBufSize); return &b }}

// maxChunkLine bounds a chunk-size or trailer line.
const maxChunkLine = 4096

// Framings of an engine's body.
const (
	frameClose   = iota // the body ends with the connection
	frameLength         // Content-Length bytes
	frameChunked        // chunked transfer coding
)

// States of the chunked decoder.
const (
	chunkSize    = iota // expecting a chunk-size line
	chunkDataEnd        // expecting the CRLF after a chunk's data
	chunkTrailer        // expecting trailer lines up to the empty one
)

// sseReader splits an engine's event stream into events (the bytes between
// blank lines). It reads the engine connection itself, decoding the body's
// framing in place, into a pooled buffer that grows only for large events,
// up to the chunk bound. IMPORTANT: while nothing is pending it holds no
// buffer at all: on unix it waits for the connection to become readable
// with syscall.RawConn and takes a buffer only when there are bytes to read
// (see readConn). A thousand idle streams hold no read buffers.
//
// Buffer layout: buf[start:dec] is decoded body not yet returned as
// events; buf[dec:end] is raw bytes not yet decoded (a partial chunk line).
type sseReader struct {
	conn   net.Conn
	raw    syscall.RawConn       // nil: plain reads that hold the buffer
	readFn func(fd uintptr) bool // s.readRaw, bound once
	rn     int                   // readRaw's result
	rerr   error                 // readRaw's result

	bp              *[]byte // the pooled buffer buf came from
	buf             []byte
	start, dec, end int
	max             int

	timed  bool          // fill measures how long its read waited (waited)
	waited time.Duration // how long the last read waited for the engine

	// want is the end of the wait readWithin asked for last; armed is the
	// connection's read deadline, which readWithin leaves where it is while
	// it comes at most a sixteenth of the bound before want (rearm).
	want, armed time.Time

	// low: the kernel wakes the reader only once lowWaterBytes are
	// pending or the engine closed the connection (lowWater); reads are
	// bounded by until instead of the connection's deadline, and look at
	// the connection every lowWaterCheck on their own.
	low     bool
	until   time.Time
	first   bool // readRaw's read was the first of its RawConn.Read
	clocked bool // low: the last bytes were read on the clock, not on a wake-up
	reads   int  // reads of the connection that returned bytes or its end (low: those the kernel woke it for)

	frame int
	left  int64 // bytes left in the current chunk (chunked) or body (length)
	chunk int   // state of the chunked decoder
	done  bool  // the body's end was decoded
	extra bool  // bytes followed the body's end
	eof   bool  // the body ended cleanly
	err   error
}

// newSSEReader takes over an answer's body from call: the bytes the head's
// reader had buffered, then the connection. The head's reader goes back to
// its pool and the head is dropped.
func newSSEReader(call *engineCall, max int) *sseReader {
	s := &sseReader{conn: call.conn, max: max, frame: frameClose}
	resp := call.Resp
	switch {
	case len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked":
		s.frame = frameChunked
	case resp.ContentLength >= 0:
		s.frame, s.left = frameLength, resp.ContentLength
		s.done = s.left == 0
	}
	if n := call.br.Buffered(); n > 0 {
		s.acquire()
		if n > len(s.buf) {
			s.buf = make([]byte, n)
		}
		b, _ := call.br.Peek(n)
		s.end = copy(s.buf, b)
		_, _ = call.br.Discard(n)
		if err := s.decode(); err != nil {
			s.err = err
		}
	}
	call.releaseReader()
	call.Resp = nil
	s.initRaw()
	return s
}

// acquire takes a pooled buffer.
func (s *sseReader) acquire() {
	s.bp = eventBufPool.Get().(*[]byte)
	s.buf = *s.bp
	s.start, s.dec, s.end = 0, 0, 0
}

// release gives the buffer back (a grown one is left to the collector).
func (s *sseReader) release() {
	if s.bp != nil && len(s.buf) == len(*s.bp) {
		eventBufPool.Put(s.bp)
	}
	s.bp, s.buf = nil, nil
	s.start, s.dec, s.end = 0, 0, 0
}

// reusable reports whether the connection may carry another request: the
// body's framing ended it cleanly and nothing followed it, and it has no
// low-water mark (an engine that closes its connections after a stream
// was read with one).
func (s *sseReader) reusable() bool {
	return s.frame != frameClose && s.eof && s.done && !s.extra && !s.low
}

// eventBoundary finds the end of the first event in b: the index of the
// separator and its length.
func eventBoundary(b []byte) (int, int) {
	off := 0
	for {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			return -1, 0
		}
		i += off
		if i+1 < len(b) && b[i+1] == '\n' {
			return i, 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i, 3
		}
		off = i + 1
	}
}

// buffered reports whether a whole event is buffered already.
func (s *sseReader) buffered() bool {
	i, _ := eventBoundary(s.buf[s.start:s.dec])
	return i >= 0
}

// next returns the next event, valid until the next call; io.EOF at the
// end (after a last event without its blank line), errTooLarge for an
// event over the bound.
func (s *sseReader) next() ([]byte, error) {
	for {
		if s.start < s.dec {
			if i, n := eventBoundary(s.buf[s.start:s.dec]); i >= 0 {
				ev := s.buf[s.start : s.start+i]
				s.start += i + n
				if len(bytes.TrimSpace(ev)) == 0 {
					continue
				}
				if len(ev) > s.max+16 {
					return nil, errTooLarge
				}
				return ev, nil
			}
			if s.dec-s.start > s.max+16 {
				return nil, errTooLarge
			}
		}
		if s.err != nil {
			if s.start < s.dec && len(bytes.TrimSpace(s.buf[s.start:s.dec])) > 0 {
				ev := s.buf[s.start:s.dec]
				s.start = s.dec
				return ev, nil
			}
			return nil, s.err
		}
		s.fill()
	}
}

// fill reads more of the body and decodes it; it sets s.err at the end.
func (s *sseReader) fill() {
	if s.done {
		s.eof = true
		s.err = io.EOF
		return
	}
	if s.buf != nil {
		if s.start > 0 {
			n := copy(s.buf, s.buf[s.start:s.end])
			s.dec -= s.start
			s.start, s.end = 0, n
		}
		if s.end == len(s.buf) {
			size := min(2*len(s.buf), s.max+maxChunkLine+64)
			if size <= len(s.buf) {
				s.err = errTooLarge
				return
			}
			nb := make([]byte, size)
			copy(nb, s.buf[:s.end])
			s.buf = nb
		}
	}
	var start time.Time
	if s.timed {
		start = time.Now()
	}
	n, err := s.readConn()
	if s.timed {
		s.waited = time.Since(start)
	}
	s.end += n
	if derr := s.decode(); derr != nil {
		s.err = derr
		return
	}
	switch {
	case err == nil:
	case errors.Is(err, io.EOF) && s.frame == frameClose:
		s.done, s.eof = true, true
		s.err = io.EOF
	case errors.Is(err, io.EOF) && !s.done:
		s.err = io.ErrUnexpectedEOF
	default:
		s.err = err
	}
}

// readWithin bounds the wait for the engine's next bytes (the stream idle
// bound; a second for the end of a complete answer). The relay calls it
// at every read; the connection's deadline moves only when the one it
// has would come more than d/16 before the new bound (or after it): a
// read that meets the earlier deadline waits on until the bound (rearm).
// One deadline change per sixteenth of the bound, not one per read.
func (s *sseReader) readWithin(d time.Duration) {
	now := time.Now()
	if s.low {
		s.until = now.Add(d)
		return
	}
	s.want = now.Add(d)
	if early := s.want.Sub(s.armed); early >= 0 && early < d/16 {
		return
	}
	s.armed = s.want
	_ = s.conn.SetReadDeadline(s.want)
}

// rearm moves a read deadline that passed before the bound readWithin
// asked for to that bound; false when the bound itself passed (or the
// deadline is not readWithin's).
func (s *sseReader) rearm(err error) bool {
	if s.low || !errors.Is(err, os.ErrDeadlineExceeded) || !s.armed.Before(s.want) {
		return false
	}
	s.armed = s.want
	_ = s.conn.SetReadDeadline(s.want)
	return true
}

// lowWaterBytes is the low-water mark of an assembled answer's engine
// connection (lowWater): about a hundred tokens of llama-server's events.
const lowWaterBytes = 32 << 10

// lowWaterCheck is how often a read with the low-water mark looks at the
// connection without a wake-up: it bounds how late the end of an answer
// is seen if the engine did not close the connection after all, and how
// precisely the stream idle bound is kept.
const lowWaterCheck = 200 * time.Millisecond

// readPlain reads into the buffer, holding it while it waits.
func (s *sseReader) readPlain() (int, error) {
	if s.buf == nil {
		s.acquire()
	}
	for {
		n, err := s.conn.Read(s.buf[s.end:])
		if n == 0 && s.rearm(err) {
			continue
		}
		return n, err
	}
}

// decode turns the raw bytes buf[dec:end] into body bytes in place,
// removing the chunked coding's framing; a partial framing line stays
// raw.
func (s *sseReader) decode() error {
	raw := s.dec
	for raw < s.end && !s.done {
		if s.frame == frameClose {
			s.keep(&raw, s.end-raw)
			continue
		}
		if s.left > 0 {
			n := int(min(int64(s.end-raw), s.left))
			s.keep(&raw, n)
			s.left -= int64(n)
			if s.frame == frameLength && s.left == 0 {
				s.done = true
			}
			continue
		}
		if s.frame == frameLength {
			s.done = true
			break
		}
		i := bytes.IndexByte(s.buf[raw:s.end], '\n')
		if i < 0 {
			if s.end-raw > maxChunkLine {
				return errChunkedCoding
			}
			break
		}
		line := bytes.TrimSuffix(s.buf[raw:raw+i], []byte("\r"))
		raw += i + 1
		switch s.chunk {
		case chunkSize:
			n, err := parseChunkSize(line)
			if err != nil {
				return err
			}
			if n == 0 {
				s.chunk = chunkTrailer
			} else {
				s.left, s.chunk = n, chunkDataEnd
			}
		case chunkDataEnd:
			if len(line) != 0 {
				return errChunkedCoding
			}
			s.chunk = chunkSize
		case chunkTrailer:
			if len(line) == 0 {
				s.done = true
			}
		}
	}
	if s.done && raw < s.end {
		s.extra = true
		raw = s.end
	}
	// Close the gap the framing left.
	if raw > s.dec {
		s.end = s.dec + copy(s.buf[s.dec:], s.buf[raw:s.end])
	}
	return nil
}

// keep moves n body bytes from *raw to the end of the decoded part.
func (s *sseReader) keep(raw *int, n int) {
	if *raw != s.dec {
		copy(s.buf[s.dec:], s.buf[*raw:*raw+n])
	}
	s.dec += n
	*raw += n
}

// parseChunkSize reads a chunk-size line (hex digits, then optional
// extensions after ';').
func parseChunkSize(line []byte) (int64, error) {
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return 0, errChunkedCoding
	}
	var n int64
	for _, c := range line {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, errChunkedCoding
		}
		n = n<<4 | int64(c)
	}
	return n, nil
}

// Kinds of events.
const (
	evComment = iota
	evData
	evDone
	evError
)

var doneData = []byte("[DONE]")

// classify reads an event: data (a chunk), [DONE], an error (a data
// payload with a top-level "error", an "event: error", or llama.cpp's
// "error:" line) or a comment.
func classify(ev []byte) (int, []byte) {
	if len(ev) > 6 && string(ev[:6]) == "data: " && bytes.IndexByte(ev, '\n') < 0 {
		p := ev[6:]
		if len(p) > 0 && p[len(p)-1] == '\r' {
			p = p[:len(p)-1]
		}
		return dataKind(p, false), p
	}
	var data []byte
	var isErr bool
	multi := false
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		switch {
		case len(line) == 0 || line[0] == ':':
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(line[5:], []byte(" "))
			if data != nil {
				if !multi {
					data = append([]byte(nil), data...)
					multi = true
				}
				data = append(append(data, '\n'), v...)
			} else {
				data = v
			}
		case bytes.HasPrefix(line, []byte("error:")):
			data = bytes.TrimSpace(line[6:])
			isErr = true
		case bytes.Equal(bytes.TrimSpace(line), []byte("event: error")):
			isErr = true
		}
	}
	if data == nil {
		if isErr {
			return evError, []byte(`{"error":{"message":"the engine reported an error"}}`)
		}
		return evComment, nil
	}
	return dataKind(data, isErr), data
}

func dataKind(p []byte, isErr bool) int {
	if bytes.Equal(p, doneData) {
		return evDone
	}
	if isErr || isErrorJSON(p) {
		return evError
	}
	return evData
}

// isErrorJSON reports a JSON object whose first key is "error", or an
// OpenAI-style {"object":"error"}.
func isErrorJSON(p []byte) bool {
	i := 0
	for i < len(p) && (p[i] == ' ' || p[i] == '\t') {
		i++
	}
	if i >= len(p) || p[i] != '{' {
		return false
	}
	i++
	for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') {
		i++
	}
	if bytes.HasPrefix(p[i:], []byte(`"error"`)) {
		return true
	}
	return bytes.HasPrefix(p[i:], []byte(`"object":"error"`)) || bytes.HasPrefix(p[i:], []byte(`"object": "error"`))
}
