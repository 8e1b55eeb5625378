// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// Event stream tuning.
var (
	// HeartbeatInterval is how often an idle stream sends ": heartbeat".
	HeartbeatInterval = 15 * time.Second
	// eventPage bounds one read of the journal.
	eventPage = 256
	// streamLifetime bounds one stream; the client reconnects with its cursor.
	streamLifetime = 30 * time.Minute
	// maxStreams bounds the event streams open at once.
	maxStreams = 32
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// streamSlots counts the open event streams.
type streamSlots struct {
	mu   sync.Mutex
	open int
}

func (s *streamSlots) take() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open >= maxStreams {
		return false
	}
	s.open++
	return true
}

func (s *streamSlots) give() {
	s.mu.Lock()
	s.open--
	s.mu.Unlock()
}

// cursor returns the journal's current cursor "<incarnation>:<seq>".
func (b *Backend) cursor() (string, error) {
	seq, err := b.Store.LatestEventSeq()
	if err != nil {
		return "", structs.Wrap(structs.CodeInternal, err, "read journal")
	}
	return b.Store.Cursor(seq), nil
}

// events serves the resumable event stream: SSE frames whose id is the
// cursor "<incarnation>:<seq>", resumed after the cursor in Last-Event-ID
// (or ?after=, which wins), a ": heartbeat" comment while idle, and a
// 410 cursor_expired answer with details.resnapshot_required when the
// cursor is older than the journal keeps or belongs to another store.
// Without a cursor the stream starts at the present: take a snapshot
// first, and follow from its cursor.
func (b *Backend) events(w http.ResponseWriter, r *http.Request) {
	after := r.Header.Get("Last-Event-ID")
	if q := r.URL.Query().Get("after"); q != "" {
		after = q
	}
	var seq uint64
	if after != "" {
		s, err := b.Store.ResolveCursor(after)
		if err != nil {
			writeMgmtError(w, err)
			return
		}
		seq = s
	} else {
		latest, err := b.Store.LatestEventSeq()
		if err != nil {
			writeMgmtError(w, structs.Wrap(structs.CodeInternal, err, "read journal"))
			return
		}
		seq = latest
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeMgmtError(w, structs.Errf(structs.CodeInternal, "streaming unsupported"))
		return
	}
	if !b.streams.take() {
		writeMgmtError(w, structs.Errf(structs.CodeUnavailable, "%d event streams are open; close one or retry", maxStreams))
		return
	}
	defer b.streams.give()
	// Subscribe before the first read, so an event appended in between
	// is not missed.
	notify, cancel := b.Store.Subscribe()
	defer cancel()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "retry: 1000\n: capyctl events after %s\n\n", b.Store.Cursor(seq))
	flusher.Flush()

	hb := time.NewTicker(HeartbeatInterval)
	defer hb.Stop()
	end := time.NewTimer(streamLifetime)
	defer end.Stop()
	for {
		for {
			evs, err := b.Store.EventsAfter(seq, eventPage)
			if err != nil {
				return
			}
			for _, ev := range evs {
				cur := b.Store.Cursor(ev.Seq)
				data, _ := json.Marshal(wire.Event{
					APIVersion: wire.APIVersion, Cursor: cur, Seq: ev.Seq, RecordedAt: ev.At, Kind: ev.Kind,
					Deployment: ev.Deployment, Instance: ev.Instance, Payload: ev.Payload,
				})
				fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", cur, ev.Kind, data)
				seq = ev.Seq
			}
			if len(evs) > 0 {
				flusher.Flush()
			}
			if len(evs) < eventPage {
				break
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-hb.C:
			fmt.Fprint(w, ": heartbeat\n\n")
			flusher.Flush()
		case _, ok := <-notify:
			if !ok {
				return
			}
		}
	}
}
