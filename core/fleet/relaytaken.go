// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/takeover"
)

// A relayed stream that stayed on net/http would hold, for as long as it
// is open, about 35 KiB of net/http's on the server, measured
// (BenchmarkFleet_MemoryPerOpenStream). As core/router does for a
// standalone role, and with the same package (core/takeover), the server
// takes such a stream's client connection over once it has run for
// takeOverAfter: it lets the handler return, relays the rest of the chunks
// (in the chunked coding net/http began) on a goroutine of its own that
// starts small, and notices a hang-up with a watcher that holds no buffer.
// A hang-up cancels the relayed stream at once, and the host cancels the
// engine's work. Once the answer is complete the connection goes back to
// the http.Server that accepted it, for the client's next request.
//
// A stream that ends sooner never pays for the take-over: it stays on
// net/http, and its keep-alive connection with it. Taking every stream
// over at its head, and closing its connection after it, cost the server
// a new client connection per stream (accept, socket options, net/http's
// buffers for it, the hijack) and the client a new dial.

// takeOverAfter is how long a stream runs on net/http before it is taken
// over: the router's (a variable for tests).
var takeOverAfter = router.DefaultTakeOverAfter

// chunkBufs hold a taken-over stream's chunk with its framing while it is
// written (a stream holds none while it waits).
var chunkBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// maxPooledChunk is the largest buffer chunkBufs takes back.
const maxPooledChunk = 64 << 10

// writeChunk writes p as one chunk of the chunked coding in one write.
//
// IMPORTANT: not takeover.WriteChunk. Its net.Buffers write with writev
// only on the net package's own connections; a connection taken over from
// the server's listener is that listener's wrapper (core/api's tracked
// connection), on which net.Buffers made one write(2) per part: three per
// chunk, each of them waking the client. A copy of the chunk costs less.
func writeChunk(conn net.Conn, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	bp := chunkBufs.Get().(*[]byte)
	b := strconv.AppendUint((*bp)[:0], uint64(len(p)), 16)
	b = append(b, '\r', '\n')
	b = append(b, p...)
	b = append(b, '\r', '\n')
	_, err := conn.Write(b)
	if cap(b) <= maxPooledChunk {
		*bp = b[:0]
		chunkBufs.Put(bp)
	}
	return err
}

// laterTakeOver returns copyStream's take-over of a stream relayed to the
// client on w: once the stream has run for takeOverAfter, at a flush, it
// takes the connection over and hands the rest to relayTaken; nil where
// the connection cannot be taken over (TLS or HTTP/2 clients, a writer
// that cannot hand its connection over). The relayed stream's cleanups go
// with it (u); rehook stops the client's context from cancelling it (the
// watcher does, after).
func laterTakeOver(w http.ResponseWriter, r *http.Request, rl hostReply, u *undo, rehook func() bool) func(*sseRelay) bool {
	if !takeover.Possible(w, r) {
		return nil
	}
	start := time.Now()
	return func(ev *sseRelay) bool {
		if time.Since(start) < takeOverAfter {
			return false
		}
		if !rehook() {
			return false // the client went: the stream ends on net/http, cancelled
		}
		conn, err := takeover.Hijack(w)
		if err != nil {
			re := context.AfterFunc(r.Context(), rl.cancel)
			u.push(func() { re() })
			return false
		}
		t := &taken{ev: ev}
		// The connection goes back to net/http after the answer unless
		// the client asked for it to close, or sent a request net/http had
		// read already (dropped: the connection must close).
		if srv, ok := r.Context().Value(http.ServerContextKey).(*http.Server); ok && !r.Close && !conn.Dropped && conn.Raw != nil {
			t.srv = srv
		}
		go relayTaken(conn, nil, rl, r.URL.Path, u.handOver(), t)
		return true
	}
}

// taken is what a stream taken over mid-way brings along: its relay state
// (what waits for its event's end) and where its connection goes after the
// answer.
type taken struct {
	ev  *sseRelay
	srv *http.Server // nil: the connection closes after the answer
}

// relayTaken relays a taken-over stream (head: its head, when net/http has
// not written it), in whole events, until the host's answer ends (or
// breaks off: then with a coded event of its own, see relaycut.go), the
// client hangs up or a write fails; then it ends the relayed stream (u)
// and hands the connection back (t.srv) or closes it.
func relayTaken(conn *takeover.Conn, head []byte, rl hostReply, path string, u *undo, t *taken) {
	if t == nil {
		t = &taken{}
	}
	if t.ev == nil {
		t.ev = &sseRelay{}
	}
	handBack := false
	defer func() {
		if !handBack {
			_ = conn.Close()
			u.run()
			return
		}
		u.run()
		takeover.HandBack(t.srv, conn.Conn)
	}()
	resp, cancel := rl.resp, rl.cancel
	if len(head) > 0 {
		if _, err := conn.Write(head); err != nil {
			return
		}
	}
	var watched chan bool // the watcher's end: whether the client hung up
	if conn.Raw != nil {
		watched = make(chan bool, 1)
		go func() {
			// A connection that closes after this answer drops the
			// client's bytes and watches on; one that goes back to
			// net/http leaves them in the socket for it, and the watch ends
			// there. A hang-up cancels the stream; a connection closed
			// here, or the deadline that ends the watch, does not.
			var w takeover.Watcher
			hungUp, _, err := w.Wait(conn.Raw, t.srv == nil)
			if hungUp || (err == nil && t.srv == nil) {
				cancel()
			}
			watched <- hungUp
		}()
	}
	// The copy buffer is pooled and held only while a chunk is on its
	// way (relayBuf: a small one, a large one after a read that filled it).
	var rb relayBuf
	ev := t.ev
	for {
		buf := rb.get()
		n, rerr := resp.Body.Read(buf)
		werr := writeChunk(conn, ev.whole(buf[:n]))
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
			if writeChunk(conn, end) != nil {
				return
			}
			if _, err := conn.Write(takeover.LastChunk); err != nil || t.srv == nil || watched == nil {
				return
			}
			// The answer is whole: end the watch, and the connection goes
			// back unless the client hung up meanwhile.
			_ = conn.SetReadDeadline(time.Unix(1, 0))
			handBack = !<-watched
			return
		}
	}
}
