// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"errors"
	"io"
	"net/http"

	"github.com/capyctl/capyctl/core/takeover"
)

// A relayed stream that stayed on net/http would hold, for as long as it
// is open, about 35 KiB of net/http's on the server, measured
// (BenchmarkFleet_MemoryPerOpenStream). As core/router does for a
// standalone role, and with the same package (core/takeover), the server
// takes such a stream's client connection over once the host's answer
// head has arrived: it writes the head itself (Connection: close, so the
// connection is not handed back), lets the handler return, relays the
// chunks on a goroutine of its own that starts small, and notices a
// hang-up with a watcher that holds no buffer. A hang-up cancels the
// relayed stream at once, and the host cancels the engine's work.

// takeOver hands a streamed answer's client connection to relayTaken and
// reports whether it did; false leaves the answer to net/http (a TLS or
// HTTP/2 client, a writer that cannot hand its connection over). The
// relayed stream's cleanups go with it (undo); cancel ends it at a
// hang-up.
func takeOver(w http.ResponseWriter, r *http.Request, rl hostReply, u *undo) bool {
	resp := rl.resp
	if !takeover.Possible(w, r) {
		return false
	}
	conn, err := takeover.Hijack(w)
	if err != nil {
		return false
	}
	h := w.Header().Clone()
	copyHeaders(h, resp.Header, relayAnswerHeaders)
	var head bytes.Buffer
	takeover.WriteHead(&head, resp.StatusCode, h, true)
	mine := u.handOver()
	mine.push(func() { _ = conn.Close() })
	path := r.URL.Path
	go relayTaken(conn, head.Bytes(), rl, path, mine)
	return true
}

// relayTaken relays a taken-over stream, in whole events, until the host's
// answer ends (or breaks off: then with a coded event of its own, see
// relaycut.go), the client hangs up or a write fails, then closes the
// connection and ends the relayed stream (u).
func relayTaken(conn *takeover.Conn, head []byte, rl hostReply, path string, u *undo) {
	defer u.run()
	resp, cancel := rl.resp, rl.cancel
	if _, err := conn.Write(head); err != nil {
		return
	}
	if conn.Raw != nil {
		go func() {
			// Bytes the client sends on a connection that closes after
			// this answer are dropped; a hang-up cancels the stream, and a
			// connection closed here ends the watch.
			var w takeover.Watcher
			if hungUp, _, err := w.Wait(conn.Raw, true); hungUp || err == nil {
				cancel()
			}
		}()
	}
	// The copy buffer is pooled and held only while a chunk is on its
	// way (relayBuf: a small one, a large one after a read that filled it).
	var rb relayBuf
	var ev sseRelay
	for {
		buf := rb.get()
		n, rerr := resp.Body.Read(buf)
		werr := takeover.WriteChunk(conn, ev.whole(buf[:n]))
		rb.put(n)
		if werr != nil {
			return
		}
		if rerr != nil {
			end := ev.rest()
			if !errors.Is(rerr, io.EOF) {
				if end = brokeOff(rl, path, rerr); end == nil {
					return // cut: no last chunk that would make it look whole
				}
			}
			if takeover.WriteChunk(conn, end) == nil {
				_, _ = conn.Write(takeover.LastChunk)
			}
			return
		}
	}
}
