// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxEventSize bounds one event's data unless the reader is told
// otherwise.
const DefaultMaxEventSize = 1 << 20

// ErrEventTooLarge is returned when an event (or one line) exceeds the
// reader's maximum size.
var ErrEventTooLarge = errors.New("sse event too large")

// Event is one server-sent event, or one comment line.
type Event struct {
	// Field is the field that carried the data: "data" for a standard
	// event, or another name for a non-standard line, such as "error" for
	// llama.cpp's raw `error: {...}` lines. "" for a comment.
	Field string
	// Data is the event's data; several lines of one field are joined by
	// "\n". For a comment it is the text after ':' (one leading space
	// removed).
	Data []byte
	// Comment is true for a comment line (": ping").
	Comment bool
	// Type is the value of the "event:" field, "" when absent.
	Type string
	// ID is the value of the "id:" field, "" when absent.
	ID string
}

// Done reports whether the event is the OpenAI end-of-stream marker
// "data: [DONE]".
func (e Event) Done() bool {
	return e.Field == "data" && bytes.Equal(bytes.TrimSpace(e.Data), []byte("[DONE]"))
}

// SSEReader reads server-sent events one by one. It accepts "\n", "\r\n"
// and "\r" line ends, returns comments as events of their own, joins
// multi-line data with "\n", and dispatches an event at a blank line, when
// another data-carrying field starts (llama.cpp writes `error: {...}` right
// before `data: [DONE]`), and at the end of the stream.
type SSEReader struct {
	// MaxEventSize bounds one event's data (and one line); set it before the
	// first Next. 0 means DefaultMaxEventSize.
	MaxEventSize int

	r       io.Reader
	sc      *bufio.Scanner
	started bool
	err     error

	// The event being assembled.
	field   string
	data    []byte
	hasData bool
	typ, id string
}

// NewSSEReader returns a reader of the events in r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: r}
}

// Next returns the next event or comment. At the end of the stream it
// returns io.EOF; after ErrEventTooLarge or a read error, it keeps
// returning that error.
func (s *SSEReader) Next() (Event, error) {
	if s.err != nil {
		return Event{}, s.err
	}
	if s.sc == nil {
		limit := s.MaxEventSize
		if limit <= 0 {
			limit = DefaultMaxEventSize
		}
		s.MaxEventSize = limit
		s.sc = bufio.NewScanner(s.r)
		// The line limit leaves room for the field name.
		s.sc.Buffer(make([]byte, 0, min(4096, limit+64)), limit+64)
		s.sc.Split(splitSSELines)
	}
	for {
		if !s.sc.Scan() {
			err := s.sc.Err()
			switch {
			case errors.Is(err, bufio.ErrTooLong):
				s.err = fmt.Errorf("%w: a line exceeds %d bytes", ErrEventTooLarge, s.MaxEventSize)
			case err != nil:
				s.err = fmt.Errorf("read sse: %w", err)
			default:
				s.err = io.EOF
			}
			// An event cut off without its blank line is still an event.
			if ev, ok := s.dispatch(); ok && s.err == io.EOF {
				return ev, nil
			}
			return Event{}, s.err
		}
		line := s.sc.Bytes()
		if !s.started {
			s.started = true
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf")) // BOM
		}
		if len(line) == 0 {
			if ev, ok := s.dispatch(); ok {
				return ev, nil
			}
			continue
		}
		if line[0] == ':' {
			return Event{Comment: true, Data: append([]byte(nil), trimOneSpace(line[1:])...)}, nil
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], trimOneSpace(line[i+1:])
		}
		switch string(field) {
		case "event":
			s.typ = string(value)
		case "id":
			s.id = string(value)
		case "retry":
			// Reconnection is the caller's business.
		default:
			if s.hasData && string(field) != s.field {
				// A new data-carrying field ends the event before it.
				ev, _ := s.dispatch()
				s.add(string(field), value)
				if s.err == nil && len(s.data) > s.MaxEventSize {
					s.err = fmt.Errorf("%w: over %d bytes", ErrEventTooLarge, s.MaxEventSize)
				}
				return ev, nil
			}
			s.add(string(field), value)
			if len(s.data) > s.MaxEventSize {
				s.err = fmt.Errorf("%w: over %d bytes", ErrEventTooLarge, s.MaxEventSize)
				return Event{}, s.err
			}
		}
	}
}

// add appends one line of a data-carrying field to the event.
func (s *SSEReader) add(field string, value []byte) {
	if s.hasData {
		s.data = append(s.data, '\n')
	}
	s.field = field
	s.data = append(s.data, value...)
	s.hasData = true
}

// dispatch returns the assembled event, if it has data, and resets it.
func (s *SSEReader) dispatch() (Event, bool) {
	defer func() { s.field, s.data, s.hasData, s.typ, s.id = "", nil, false, "", "" }()
	if !s.hasData {
		return Event{}, false
	}
	return Event{Field: s.field, Data: s.data, Type: s.typ, ID: s.id}, true
}

// trimOneSpace removes one leading space, as the SSE format says.
func trimOneSpace(b []byte) []byte {
	if len(b) > 0 && b[0] == ' ' {
		return b[1:]
	}
	return b
}

// splitSSELines splits at "\n", "\r\n" or a lone "\r".
func splitSSELines(data []byte, atEOF bool) (int, []byte, error) {
	i := bytes.IndexAny(data, "\r\n")
	if i < 0 {
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	}
	if data[i] == '\n' {
		return i + 1, data[:i], nil
	}
	// '\r': a "\r\n" pair or a lone '\r'; wait to see which.
	if i+1 < len(data) {
		if data[i+1] == '\n' {
			return i + 2, data[:i], nil
		}
		return i + 1, data[:i], nil
	}
	if atEOF {
		return i + 1, data[:i], nil
	}
	return 0, nil, nil
}
