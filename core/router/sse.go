// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

// errTooLarge is an event larger than the chunk bound.
var errTooLarge = errors.New("sse event over the chunk bound")

var eventBufPool = sync.Pool{New: func() any { b := make([]byte, 2048); return &b }}

// sseReader splits an engine's event stream into events (the bytes
// between blank lines), reading into one buffer that grows only for large
// events, up to the chunk bound.
type sseReader struct {
	r          io.Reader
	bp         *[]byte
	buf        []byte
	start, end int
	max        int
	eof        bool
	err        error
}

func newSSEReader(r io.Reader, max int) *sseReader {
	bp := eventBufPool.Get().(*[]byte)
	return &sseReader{r: r, bp: bp, buf: *bp, max: max}
}

func (s *sseReader) release() {
	if s.bp != nil && len(s.buf) == len(*s.bp) {
		eventBufPool.Put(s.bp)
	}
	s.bp, s.buf = nil, nil
}

// eventEnd finds the end of the first event in b: the index of the
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
	i, _ := eventBoundary(s.buf[s.start:s.end])
	return i >= 0
}

// next returns the next event, valid until the next call; io.EOF at the
// end (after a last event without its blank line), errTooLarge for an
// event over the bound.
func (s *sseReader) next() ([]byte, error) {
	for {
		if s.start < s.end {
			if i, n := eventBoundary(s.buf[s.start:s.end]); i >= 0 {
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
			if s.end-s.start > s.max+16 {
				return nil, errTooLarge
			}
		}
		if s.err != nil {
			if s.start < s.end && len(bytes.TrimSpace(s.buf[s.start:s.end])) > 0 {
				ev := s.buf[s.start:s.end]
				s.start = s.end
				return ev, nil
			}
			return nil, s.err
		}
		if s.start > 0 {
			n := copy(s.buf, s.buf[s.start:s.end])
			s.start, s.end = 0, n
		}
		if s.end == len(s.buf) {
			size := 2 * len(s.buf)
			if size > s.max+4096 {
				size = s.max + 4096
			}
			if size <= len(s.buf) {
				return nil, errTooLarge
			}
			nb := make([]byte, size)
			copy(nb, s.buf[:s.end])
			s.buf = nb
		}
		n, err := s.r.Read(s.buf[s.end:])
		s.end += n
		if err != nil {
			if errors.Is(err, io.EOF) {
				s.eof = true
			}
			s.err = err
		}
	}
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
