// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package client

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// EventStream reads the management event stream (GET /events).
type EventStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	// Cursor is the cursor of the last event read (or the one the stream
	// was opened after): reopen with it to resume.
	Cursor string
	// Heartbeats counts the ": heartbeat" comments read so far.
	Heartbeats int
}

// Events opens the event stream after cursor ("" starts at the present;
// take a Snapshot first and pass its Cursor to miss nothing). A cursor
// the journal no longer covers fails with cursor_expired and
// details.resnapshot_required: take a new snapshot.
func (c *Client) Events(ctx context.Context, cursor string) (*EventStream, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+wire.Prefix+"/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "text/event-stream")
	if cursor != "" {
		req.Header.Set("Last-Event-ID", cursor)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, structs.Wrap(structs.CodeRoleNotRunning, err, "reach the management API at %s", c.base)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var env wire.ErrorEnvelope
		if json.Unmarshal(data, &env) == nil && env.Error.Code != "" {
			return nil, (&Error{Status: resp.StatusCode, Body: env.Error}).AsStructs()
		}
		return nil, structs.Errf(structs.CodeInternal, "management API answered %d: %s", resp.StatusCode, strings.TrimSpace(string(data)))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &EventStream{body: resp.Body, sc: sc, Cursor: cursor}, nil
}

// Next returns the next event, counting heartbeats on the way. It returns
// io.EOF when the server ended the stream (reopen with s.Cursor).
func (s *EventStream) Next() (*wire.Event, error) {
	var data strings.Builder
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "":
			if data.Len() == 0 {
				continue
			}
			var ev wire.Event
			if err := json.Unmarshal([]byte(data.String()), &ev); err != nil {
				return nil, fmt.Errorf("decode event: %w", err)
			}
			s.Cursor = ev.Cursor
			return &ev, nil
		case strings.HasPrefix(line, ":"):
			if strings.TrimSpace(line[1:]) == "heartbeat" {
				s.Heartbeats++
			}
		case strings.HasPrefix(line, "data:"):
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	if err := s.sc.Err(); err != nil {
		return nil, err
	}
	return nil, io.EOF
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.body.Close() }

// Follow calls fn with every event after cursor until ctx ends, fn returns
// an error, or the cursor expires (cursor_expired: take a new snapshot).
// It reconnects with the last cursor when the stream ends or the
// connection breaks, waiting up to a second between tries.
func (c *Client) Follow(ctx context.Context, cursor string, fn func(*wire.Event) error) error {
	backoff := 50 * time.Millisecond
	for {
		s, err := c.Events(ctx, cursor)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !Retryable(err) {
				return err
			}
		} else {
			for {
				ev, err := s.Next()
				if err != nil {
					break
				}
				backoff = 50 * time.Millisecond
				cursor = s.Cursor
				if err := fn(ev); err != nil {
					s.Close()
					return err
				}
			}
			s.Close()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		if backoff < time.Second {
			backoff *= 2
		}
	}
}

// NewIdempotencyKey returns a fresh random key (26 Crockford base32
// digits) for a mutation; keep it to retry the same request.
func NewIdempotencyKey() string {
	const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	var b [26]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = crockford[b[i]&31]
	}
	return string(b[:])
}

// IsCursorExpired reports whether err is cursor_expired (take a new
// snapshot and follow from its cursor).
func IsCursorExpired(err error) bool {
	var se *structs.Error
	return errors.As(err, &se) && se.Code == structs.CodeCursorExpired
}
