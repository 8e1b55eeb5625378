// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/takeover"
)

// Taking an open stream off net/http.
//
// An open stream relayed on a net/http handler costs about 25 KiB that are
// net/http's own: the connection's 4 KiB reader and 4 KiB writer, the
// answer's 2 KiB writer, the request, the handler's 8 KiB stack and the
// goroutine net/http runs to notice a hang-up (measured by
// BenchmarkNetHTTPFloor_MemoryPerOpenStream). Once a streamed answer has
// started and must wait for more of the engine's output, the router takes
// the client connection over (http.Hijacker), drops net/http's buffers, lets
// the handler return and relays the rest on a goroutine of its own that
// starts small and waits for the engine holding no buffer (sseReader). A
// watcher goroutine waits for the client socket to become readable, holding
// no buffer either (core/takeover, shared with the server's relay): end of file or an error is a hang-up,
// cut on the engine at once.
//
// The wire stays what net/http sends: the same head and the chunked coding,
// so that a client still tells a complete answer from a broken one, and the
// connection stays open after the answer. Once the answer is complete, the
// watcher waits for the client's next request, still without a buffer, and
// hands the connection back to the http.Server that accepted it (Serve with
// a listener of that one connection); a client that closes it instead, or
// a role that drains, closes it.
//
// A stream is taken over at a flush once it has run for TakeOverAfter
// (takeOverOrWait): its head has not been written yet, or was written by
// net/http (while it waited for its model, progress comments; or at an
// earlier flush); the taken-over answer goes on in the chunked coding
// net/http began. An answer complete by its first flush after
// TakeOverAfter stays on net/http.
// Non-streamed answers, HTTP versions other than 1.1, TLS, and systems
// without the watcher (takeover.Supported) stay on net/http.

// Where a request's answer bytes go.
const (
	cwHTTP     = iota // net/http's ResponseWriter
	cwPending         // the router's buffer: a 200 event stream whose head waits for the first flush
	cwHijacked        // the client connection the router took over
)

// errShutdown cuts the streams still open when the role's drain timeout
// ends.
var errShutdown = errors.New("the role is shutting down")

// clientConn is a client connection the router took over from net/http.
type clientConn struct {
	rt   *Router
	conn net.Conn
	raw  syscall.RawConn // nil: the plain watcher, and no keep-alive
	srv  *http.Server    // where the connection goes back after the answer (nil: it closes)
	keep bool            // the request allows keep-alive and no byte of the client's was dropped
	gone atomic.Bool     // the client hung up (or a write to it failed)

	mu         sync.Mutex
	q          *request // nil once the answer ended
	closed     bool     // closeNow ran: close conn as soon as it is set
	ended      bool     // the answer is complete: the watcher waits for the next request
	watching   bool     // the watcher waits
	next       bool     // the watcher saw the client's bytes (its next or a pipelined request)
	handedBack bool     // the connection is net/http's again

	watcher takeover.Watcher // waits for the client socket, holding no buffer
}

// setConn records the connection once hijacked; false when the stream was
// closed meanwhile (the connection is closed then).
func (c *clientConn) setConn(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn = conn
	if c.closed {
		_ = conn.Close()
		return false
	}
	return true
}

// closeNow closes the client connection from any goroutine: the relay's
// writes and the watcher end at once. A connection handed back to net/http
// is net/http's to close.
func (c *clientConn) closeNow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn != nil && !c.handedBack {
		_ = c.conn.Close()
	}
}

// watched acts on what the watcher found when it returned: a hang-up, the
// client's bytes, or neither (the connection was closed).
func (c *clientConn) watched(hungUp, bytes bool) {
	c.mu.Lock()
	c.watching = false
	c.next = bytes
	q, ended, closed := c.q, c.ended, c.closed
	c.mu.Unlock()
	switch {
	case closed || (!hungUp && !bytes):
	case hungUp:
		c.gone.Store(true)
		if ended {
			c.closeIdle()
		} else {
			q.cutter.cut(errClientGone)
		}
	case ended:
		c.handBack()
	}
	// Bytes while the answer goes on: net/http stops noticing hang-ups
	// once a pipelined request arrives too. The bytes stay in the socket
	// for the next request.
}

// watch waits for the client socket to become readable, holding no buffer,
// and reads nothing: a hang-up cuts the stream's engine work, the
// client's bytes stay for net/http (watched).
func (c *clientConn) watch() {
	hungUp, bytes, err := c.watcher.Wait(c.raw, false)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Only an idle connection has a read deadline (end): the server's
		// idle timeout passed.
		c.idleTimedOut()
		return
	}
	c.watched(hungUp, bytes)
}

// watchPlain is the watcher of a connection that offers no
// syscall.RawConn (one a listener wrapped): a one-byte read, so that the
// client's bytes are lost and the connection closes after the answer.
func (c *clientConn) watchPlain() {
	c.watched(takeover.WatchPlain(c.conn), false)
}

// end follows a complete answer: the connection waits for the client's
// next request (the watcher hands it back to net/http), or closes.
func (c *clientConn) end() {
	if c.raw == nil || c.srv == nil || !c.keep || !c.rt.streams.addIdle(c) {
		c.closeNow()
		return
	}
	// IMPORTANT: the answer's last write deadline (the client read bound)
	// must not outlive it: net/http clears its own only after its final
	// flush, so the next request on the connection would flush its first
	// bytes (a progress comment) into an expired deadline, and the client
	// would see the connection closed with no answer.
	_ = c.conn.SetWriteDeadline(time.Time{})
	c.mu.Lock()
	c.ended, c.q = true, nil
	back := !c.watching && c.next && !c.closed
	dead := !c.watching && !c.next
	if !back && !dead && c.srv.IdleTimeout > 0 {
		// The wait for the next request ends with the server's idle
		// timeout, as it would on net/http (the watcher sees the deadline).
		_ = c.conn.SetReadDeadline(time.Now().Add(c.srv.IdleTimeout))
	}
	c.mu.Unlock()
	switch {
	case back:
		c.handBack()
	case dead:
		c.closeIdle()
	}
}

// idleTimedOut closes a connection whose wait for a next request passed the
// server's idle timeout.
func (c *clientConn) idleTimedOut() {
	c.mu.Lock()
	c.watching = false
	c.mu.Unlock()
	c.closeIdle()
}

// closeIdle closes a connection that waited for a next request.
func (c *clientConn) closeIdle() {
	c.closeNow()
	c.rt.streams.removeIdle(c)
}

// handBack gives the connection back to the http.Server that accepted it,
// which reads the client's next request as on a new connection; it closes
// the connection when that server is shutting down.
func (c *clientConn) handBack() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.handedBack = true
	c.mu.Unlock()
	c.rt.streams.removeIdle(c)
	takeover.HandBack(c.srv, c.conn)
}

// wantsTakeOver reports whether the relay should take the client connection
// over before its flush: a stream whose answer goes on (not complete yet)
// and whose head is still the router's to write, or net/http's (written
// while it waited for its model).
func (q *request) wantsTakeOver(st *sseState) bool {
	return q.cc == nil && !st.trailer && (q.cw == cwPending || q.headViaHTTP)
}

// takeOverOrWait takes a stream over at a flush once it has run for
// TakeOverAfter; a younger one goes on on net/http, which writes its head
// (the router may take it over at a later flush, in the chunked coding
// net/http began). A stream that ends within TakeOverAfter never pays for
// the take-over: the hijack, the watcher, the relay's goroutine and the
// connection's hand-back cost it more than net/http's buffers held for a
// few milliseconds.
func (q *request) takeOverOrWait() {
	if after := q.rt.cfg.TakeOverAfter; after > 0 && time.Since(q.start) < after {
		if q.cw == cwPending {
			q.commitHTTP()
			q.headViaHTTP = true
		}
		return
	}
	if !q.takeOver() {
		// flush hands a pending head to net/http; a head net/http wrote
		// stays there.
		q.headViaHTTP = false
	}
}

// takeOver hijacks the client connection and writes the head and what is
// buffered; false (nothing changed) when the role is draining or net/http
// refuses. IMPORTANT: the stream is registered before the hijack, while
// net/http still counts the connection as active, so that a Shutdown that
// returns has every taken-over stream in the registry for Drain.
func (q *request) takeOver() bool {
	cc := &clientConn{rt: q.rt, q: q}
	if !q.rt.streams.add(cc) {
		return false
	}
	if q.cw == cwHTTP && q.flushHTTP() != nil {
		q.rt.streams.remove(cc)
		return false
	}
	cc.srv, _ = q.r.Context().Value(http.ServerContextKey).(*http.Server)
	cc.keep = !q.r.Close
	conn, err := takeover.Hijack(q.w)
	if err != nil {
		q.rt.streams.remove(cc)
		return false
	}
	// Bytes net/http read past the request are a pipelined request: they
	// were dropped and the connection closes after the answer, which a
	// pipelining client must expect.
	cc.keep = cc.keep && !conn.Dropped
	if !cc.setConn(conn.Conn) {
		cc.gone.Store(true)
	}
	cc.raw = conn.Raw
	var hdr http.Header
	if !q.headViaHTTP {
		hdr = q.w.Header()
	}
	q.cc, q.cw = cc, cwHijacked
	// net/http cancels the request's context when the handler returns:
	// from here on the watcher notices hang-ups. A hook that already ran
	// saw one.
	if q.stopGone != nil && !q.stopGone() {
		cc.gone.Store(true)
	}
	q.stopGone = nil
	if q.r.Context().Err() != nil {
		cc.gone.Store(true)
	}
	q.r, q.w, q.rc = nil, nil, nil
	q.setWriteDeadline()
	cc.watching = true
	if cc.raw != nil {
		go cc.watch()
	} else {
		go cc.watchPlain()
	}
	if hdr != nil {
		q.writeHead(hdr, !cc.keep)
	}
	return true
}

// writeHead writes the answer's head as net/http would have, and the
// bytes buffered so far, in one write: gathered in a pooled buffer where
// they fit, since the connection a listener wrapped (core/api's) offers
// no writev and net.Buffers would write them one by one.
func (q *request) writeHead(hdr http.Header, closing bool) {
	b := bytes.NewBuffer(make([]byte, 0, 384))
	takeover.WriteHead(b, http.StatusOK, hdr, closing)
	frame := q.out.frame(false)
	var err error
	if bp := eventBufPool.Get().(*[]byte); b.Len()+len(frame) <= len(*bp) {
		n := copy(*bp, b.Bytes())
		n += copy((*bp)[n:], frame)
		_, err = q.cc.conn.Write((*bp)[:n])
		eventBufPool.Put(bp)
	} else {
		eventBufPool.Put(bp)
		bufs := net.Buffers{b.Bytes(), frame}
		_, err = bufs.WriteTo(q.cc.conn)
	}
	q.out.release()
	q.noteWriteErr(err)
}

// flushHTTP flushes what net/http buffered.
func (q *request) flushHTTP() error {
	if q.rc == nil {
		q.rc = http.NewResponseController(q.w)
	}
	err := q.rc.Flush()
	q.noteWriteErr(err)
	if q.r.ProtoMajor == 2 {
		// IMPORTANT: over HTTP/2 a write deadline is a timer that resets
		// the stream when it fires, written to or not; the bound of what
		// was written ends with its flush, else it would run while the
		// router waits for the engine and reset a stream whose engine
		// pauses longer than client_read_idle between two chunks (every
		// stream a server relays from a host is HTTP/2).
		_ = q.rc.SetWriteDeadline(time.Time{})
	}
	return err
}

// commitHTTP hands a pending head and what is buffered to net/http: the
// answer was complete by its first flush (or could not be taken over).
func (q *request) commitHTTP() {
	q.cw = cwHTTP
	q.w.WriteHeader(http.StatusOK)
	if d := q.out.data(); len(d) > 0 {
		if _, err := q.w.Write(d); err != nil {
			q.noteWriteErr(err)
		}
	}
	q.out.release()
}

// writeOut buffers an event stream's bytes until the next flush, for a
// pending head, a taken-over connection or net/http, writing them on when
// the buffer is full (which decides a pending stream's take-over). On
// net/http, an event's pieces then reach its writer in one call per flush,
// not several per event.
func (q *request) writeOut(b []byte) error {
	for len(b) > 0 {
		if q.writeErr != nil {
			return q.writeErr
		}
		if q.out.full() {
			if q.cw == cwPending {
				if q.takeOverOrWait(); q.cw == cwPending {
					q.commitHTTP()
				}
			}
			var err error
			q.setWriteDeadline()
			if q.cw == cwHTTP {
				err = q.pushHTTP()
			} else {
				err = q.flushOut(false)
			}
			if err != nil {
				return err
			}
			continue
		}
		n := q.out.add(b)
		q.bytesOut += int64(n)
		b = b[n:]
	}
	return nil
}

// pushHTTP hands what is buffered to net/http's writer (which writes it
// at its flush).
func (q *request) pushHTTP() error {
	d := q.out.data()
	if len(d) == 0 {
		q.out.release()
		return q.writeErr
	}
	_, err := q.w.Write(d)
	q.out.release()
	if err != nil && q.writeErr == nil {
		q.writeErr = err
	}
	return err
}

// flushOut writes what is buffered to the taken-over connection as one
// chunk, and the chunked coding's last chunk when last.
func (q *request) flushOut(last bool) error {
	if q.writeErr != nil {
		q.out.release()
		return q.writeErr
	}
	b := q.out.frame(last)
	var err error
	if len(b) > 0 {
		_, err = q.cc.conn.Write(b)
	}
	q.out.release()
	q.noteWriteErr(err)
	return err
}

// noteWriteErr records the first failed write to the client. On a
// taken-over connection a failure other than the client read bound is a
// hang-up, as net/http counts it.
func (q *request) noteWriteErr(err error) {
	if err == nil {
		return
	}
	if q.writeErr == nil {
		q.writeErr = err
	}
	if q.cc != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		q.cc.gone.Store(true)
	}
}

// clientWent reports a client that hung up.
func (q *request) clientWent() bool {
	if q.cc != nil {
		return q.cc.gone.Load()
	}
	return q.r.Context().Err() != nil
}

// endTakenOver ends a taken-over answer: the last chunk, then the
// connection waits for the client's next request or closes. finish
// records the request and only then does Drain stop counting it.
func (q *request) endTakenOver() {
	cc := q.cc
	if q.writeErr == nil && !cc.gone.Load() {
		q.setWriteDeadline() // the last chunk may follow the last output by a while
	}
	if q.writeErr != nil || cc.gone.Load() || q.flushOut(true) != nil {
		q.out.release()
		cc.closeNow()
		return
	}
	cc.end()
}

// relayOn relays the rest of a stream taken over from net/http, on its own
// goroutine, and records it.
func (q *request) relayOn() {
	defer q.recoverRelay()
	st := q.st
	q.st = nil
	q.sseLoop(st)
	q.sseEnd(st)
	st.sr.release()
	q.finish()
}

// recoverRelay does for a taken-over stream what net/http does for a
// handler that panics: it logs the panic and closes the connection, and
// the role serves on. The engine request is cut and its place settles as
// a cut one does.
func (q *request) recoverRelay() {
	p := recover()
	if p == nil {
		return
	}
	q.rt.logger.Error("panic relaying a stream", "request_id", q.id, "panic", p, "stack", string(debug.Stack()))
	q.cutter.cut(errClientGone)
	q.cut(true)
	q.cc.closeNow()
	q.rt.streams.remove(q.cc)
}

// outBuf holds what the router writes to a pending or taken-over client
// until the next flush, in a pooled buffer taken at the first write and
// given back at the flush: an idle stream holds none. The buffer's first
// chunkRoom bytes are room for the chunk-size line, so that a flush is one
// write.
type outBuf struct {
	bp  *[]byte
	buf []byte // nil while empty
}

const (
	chunkRoom = 8                    // a chunk-size line: up to 6 hex digits and CRLF
	chunkTail = len("\r\n0\r\n\r\n") // the chunk's CRLF and the last chunk
)

// add buffers what fits of b and returns how much that was.
func (o *outBuf) add(b []byte) int {
	if o.buf == nil {
		o.bp = eventBufPool.Get().(*[]byte)
		o.buf = (*o.bp)[:chunkRoom]
	}
	n := min(len(b), cap(o.buf)-chunkTail-len(o.buf))
	o.buf = append(o.buf, b[:n]...)
	return n
}

// full reports a buffer with no room left.
func (o *outBuf) full() bool {
	return o.buf != nil && len(o.buf) >= cap(o.buf)-chunkTail
}

// data is what is buffered.
func (o *outBuf) data() []byte {
	if o.buf == nil {
		return nil
	}
	return o.buf[chunkRoom:]
}

// frame returns what is buffered as one chunk of the chunked coding,
// followed by the last chunk when last; valid until release.
func (o *outBuf) frame(last bool) []byte {
	var b []byte
	if n := len(o.data()); n > 0 {
		var size [chunkRoom]byte
		s := strconv.AppendUint(size[:0], uint64(n), 16)
		s = append(s, '\r', '\n')
		start := chunkRoom - len(s)
		copy(o.buf[start:], s)
		o.buf = append(o.buf, '\r', '\n')
		b = o.buf[start:]
	}
	if last {
		if b == nil {
			return takeover.LastChunk
		}
		b = append(b, takeover.LastChunk...)
	}
	return b
}

// release gives the buffer back.
func (o *outBuf) release() {
	if o.bp != nil {
		eventBufPool.Put(o.bp)
	}
	o.bp, o.buf = nil, nil
}

// streamSet is the registry of taken-over streams, which net/http's
// Shutdown no longer sees.
type streamSet struct {
	mu     sync.Mutex
	set    map[*clientConn]struct{} // streams
	idle   map[*clientConn]struct{} // connections waiting for a next request
	closed bool                     // draining: no new take-overs, no idle connections
	empty  chan struct{}            // closed when set empties, for a waiter
}

// addIdle registers a connection that waits for a next request; false once
// draining.
func (s *streamSet) addIdle(c *clientConn) bool { return s.register(&s.idle, c) }

// removeIdle forgets an idle connection.
func (s *streamSet) removeIdle(c *clientConn) {
	s.mu.Lock()
	delete(s.idle, c)
	s.mu.Unlock()
}

// add registers a stream; false once draining.
func (s *streamSet) add(c *clientConn) bool { return s.register(&s.set, c) }

// register adds c to one of the set's maps; false once draining.
func (s *streamSet) register(m *map[*clientConn]struct{}, c *clientConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if *m == nil {
		*m = map[*clientConn]struct{}{}
	}
	(*m)[c] = struct{}{}
	return true
}

// remove forgets a stream.
func (s *streamSet) remove(c *clientConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.set, c)
	if len(s.set) == 0 && s.empty != nil {
		close(s.empty)
		s.empty = nil
	}
}

// close refuses new take-overs and closes the idle connections, as
// http.Server.Shutdown closes its own.
func (s *streamSet) close() {
	s.mu.Lock()
	s.closed = true
	idle := make([]*clientConn, 0, len(s.idle))
	for c := range s.idle {
		idle = append(idle, c)
	}
	s.mu.Unlock()
	for _, c := range idle {
		c.closeIdle()
	}
}

// each calls f on every registered stream.
func (s *streamSet) each(f func(*clientConn)) {
	s.mu.Lock()
	list := make([]*clientConn, 0, len(s.set))
	for c := range s.set {
		list = append(list, c)
	}
	s.mu.Unlock()
	for _, c := range list {
		f(c)
	}
}

// wait waits until no stream is registered; false when ctx ended first.
func (s *streamSet) wait(ctx context.Context) bool {
	for {
		s.mu.Lock()
		if len(s.set) == 0 {
			s.mu.Unlock()
			return true
		}
		if s.empty == nil {
			s.empty = make(chan struct{})
		}
		ch := s.empty
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// Open returns the number of open streams the router relays on connections
// it took over from net/http.
func (rt *Router) Open() int {
	rt.streams.mu.Lock()
	defer rt.streams.mu.Unlock()
	return len(rt.streams.set)
}

// drainGrace is how long streams cut by Drain get to write their error
// event before their connections are closed.
const drainGrace = time.Second

// Drain is the role's shutdown for the streams the router took over from
// net/http (http.Server.Shutdown no longer sees them; call Drain after it):
// it takes no more over, closes their connections that wait for a next
// request, and waits for the streams open to end until ctx ends;
// then it cuts the rest like a bound does (the engine's work ends, the
// client gets a shutting_down error event and [DONE]) and closes their
// connections after a second at most.
func (rt *Router) Drain(ctx context.Context) {
	s := &rt.streams
	s.close()
	if s.wait(ctx) {
		return
	}
	s.each(func(c *clientConn) {
		c.mu.Lock()
		q := c.q
		c.mu.Unlock()
		if q != nil {
			q.cutter.cut(errShutdown)
		}
	})
	gctx, cancel := context.WithTimeout(context.Background(), drainGrace)
	defer cancel()
	if s.wait(gctx) {
		return
	}
	s.each((*clientConn).closeNow)
	gctx2, cancel2 := context.WithTimeout(context.Background(), drainGrace)
	defer cancel2()
	s.wait(gctx2)
}
