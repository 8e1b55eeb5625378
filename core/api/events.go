// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
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
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// cursor returns the journal's current cursor "<incarnation>:<seq>".
func (b *Backend) cursor() (string, error) {
	inc := b.Store.Incarnation()
	seq, err := b.Store.LatestEventSeq()
	if err != nil {
		return "", structs.Wrap(structs.CodeInternal, err, "read journal")
	}
	return fmt.Sprintf("%s:%d", inc, seq), nil
}

// parseCursor parses "<incarnation>:<seq>" (or a bare sequence number).
func (b *Backend) parseCursor(s string) (uint64, error) {
	inc := b.Store.Incarnation()
	seqPart := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		if s[:i] != inc {
			return 0, structs.Errf(structs.CodeCursorExpired, "the cursor belongs to another store (it was recreated): take a new snapshot").
				WithDetail("resnapshot_required", true)
		}
		seqPart = s[i+1:]
	}
	seq, err := strconv.ParseUint(seqPart, 10, 64)
	if err != nil {
		return 0, structs.Errf(structs.CodeInvalidCursor, "cursor %q does not parse", s)
	}
	return seq, nil
}

// events serves the resumable event stream: SSE frames with id
// "<incarnation>:<seq>", resumed from Last-Event-ID or ?after=, heartbeats
// while idle, and a cursor_expired answer (resnapshot_required) when the
// cursor is older than the journal keeps.
func (b *Backend) events(w http.ResponseWriter, r *http.Request) {
	after := r.Header.Get("Last-Event-ID")
	if q := r.URL.Query().Get("after"); q != "" {
		after = q
	}
	var seq uint64
	if after != "" {
		s, err := b.parseCursor(after)
		if err != nil {
			writeMgmtError(w, err)
			return
		}
		seq = s
		oldest, err := b.Store.OldestEventSeq()
		if err == nil && oldest > 0 && seq+1 < oldest {
			writeMgmtError(w, structs.Errf(structs.CodeCursorExpired,
				"events after %d were pruned (the journal starts at %d): take a new snapshot", seq, oldest).
				WithDetail("resnapshot_required", true).WithDetail("oldest", oldest))
			return
		}
	} else {
		latest, err := b.Store.LatestEventSeq()
		if err != nil {
			writeMgmtError(w, structs.Wrap(structs.CodeInternal, err, "read journal"))
			return
		}
		seq = latest
	}
	inc := b.Store.Incarnation()
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeMgmtError(w, structs.Errf(structs.CodeInternal, "streaming unsupported"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, ": capyctl events from %s:%d\n\n", inc, seq)
	flusher.Flush()

	notify, cancel := b.Store.Subscribe()
	defer cancel()
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
				data, _ := json.Marshal(map[string]any{
					"api_version": wire.APIVersion, "seq": ev.Seq, "recorded_at": ev.At, "kind": ev.Kind,
					"deployment": ev.Deployment, "instance": ev.Instance, "payload": ev.Payload,
				})
				fmt.Fprintf(w, "id: %s:%d\nevent: %s\ndata: %s\n\n", inc, ev.Seq, ev.Kind, data)
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
		case <-notify:
		}
	}
}
