// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package takeover takes a streamed answer's client connection off
// net/http: the standalone role's router (core/router) and the server's
// relay to its hosts (core/fleet) both use it.
//
// An open stream relayed on a net/http handler holds, for as long as it
// is open, net/http's 4 KiB reader and 4 KiB writer of the connection,
// the answer's 2 KiB writer, the handler's deep stack and the goroutine
// net/http runs to notice a hang-up (about 25 KiB on a role, 35 KiB on a
// server, measured by BenchmarkNetHTTPFloor_MemoryPerOpenStream and
// BenchmarkFleet_MemoryPerOpenStream). Once the answer's head is known,
// the caller hijacks the connection (Hijack), writes the head as net/http
// would (WriteHead: the chunked coding, so that a client still tells a
// complete answer from a broken one), relays the rest on a goroutine of
// its own that starts small, and notices a hang-up with a Watcher, which
// waits for the socket to become readable holding no buffer. Once the
// answer is complete, a connection that may live on goes back to the
// http.Server that accepted it (HandBack).
//
// Only HTTP/1.1 without TLS is taken over, on systems where the watcher
// exists (Supported); everything else stays on net/http (Possible).
package takeover

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"
)

// Possible reports whether the answer to r written on w can be taken
// over: HTTP/1.1 or later 1.x, no TLS, a writer that hands its connection
// over, and a system with the watcher.
func Possible(w http.ResponseWriter, r *http.Request) bool {
	return Supported && r.ProtoMajor == 1 && r.ProtoMinor >= 1 && r.TLS == nil && Hijackable(w)
}

// Hijackable reports whether w, or a writer it wraps, can hand its
// connection over.
func Hijackable(w http.ResponseWriter) bool {
	for {
		switch v := w.(type) {
		case http.Hijacker:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return false
		}
	}
}

// Conn is a client connection taken over from net/http.
type Conn struct {
	net.Conn
	// Raw is the socket the Watcher waits on; nil when the connection
	// offers none (a listener wrapped it): WatchPlain then.
	Raw syscall.RawConn
	// Dropped says net/http had read bytes past the request (a pipelined
	// request): they are dropped, so the connection must close after the
	// answer.
	Dropped bool
}

// Hijack takes w's connection over. What net/http read past the request
// is dropped (Conn.Dropped).
func Hijack(w http.ResponseWriter) (*Conn, error) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, err
	}
	c := &Conn{Conn: conn}
	if n := brw.Reader.Buffered(); n > 0 {
		_, _ = brw.Reader.Discard(n)
		c.Dropped = true
	}
	if sc, ok := conn.(syscall.Conn); ok {
		c.Raw, _ = sc.SyscallConn()
	}
	return c, nil
}

// headOwn are the headers WriteHead writes itself.
var headOwn = map[string]bool{"Transfer-Encoding": true, "Connection": true, "Content-Length": true}

// WriteHead appends an answer's head in HTTP/1.1 to b as net/http writes
// it for a streamed answer: the status line, the headers, Date (unless
// set), Connection: close when closing, and the chunked coding.
func WriteHead(b *bytes.Buffer, status int, hdr http.Header, closing bool) {
	b.WriteString("HTTP/1.1 ")
	b.WriteString(strconv.Itoa(status))
	b.WriteByte(' ')
	b.WriteString(http.StatusText(status))
	b.WriteString("\r\n")
	_ = hdr.WriteSubset(b, headOwn)
	if closing {
		b.WriteString("Connection: close\r\n")
	}
	if _, ok := hdr["Date"]; !ok {
		b.WriteString("Date: ")
		b.WriteString(time.Now().UTC().Format(http.TimeFormat))
		b.WriteString("\r\n")
	}
	b.WriteString("Transfer-Encoding: chunked\r\n\r\n")
}

// LastChunk ends the chunked coding.
var LastChunk = []byte("0\r\n\r\n")

var crlf = []byte("\r\n")

// WriteChunk writes p as one chunk of the chunked coding, in one write
// where the connection gathers them (writev).
func WriteChunk(conn net.Conn, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	var size [18]byte
	s := strconv.AppendUint(size[:0], uint64(len(p)), 16)
	s = append(s, '\r', '\n')
	bufs := net.Buffers{s, p, crlf}
	_, err := bufs.WriteTo(conn)
	return err
}

// WatchPlain is the watcher of a connection that offers no socket to wait
// on: a one-byte read until an error, so that the client's bytes are lost
// (the connection closes after the answer). It reports a hang-up: false
// when the connection was closed here (net.ErrClosed).
func WatchPlain(conn net.Conn) (hungUp bool) {
	var b [1]byte
	for {
		n, err := conn.Read(b[:])
		switch {
		case err == nil && n > 0:
			continue // a pipelined request, dropped
		case errors.Is(err, net.ErrClosed):
			return false
		}
		return true
	}
}

// HandBack gives a connection whose answer is complete back to the
// http.Server that accepted it, which reads the client's next request as
// on a new connection; the connection closes when that server is shutting
// down.
func HandBack(srv *http.Server, conn net.Conn) {
	_ = conn.SetReadDeadline(time.Time{})
	l := &oneConnListener{conn: conn}
	_ = srv.Serve(l)
	if l.conn != nil {
		_ = conn.Close()
	}
}

// oneConnListener hands one connection to http.Server.Serve, which returns
// at its next Accept.
type oneConnListener struct{ conn net.Conn }

func (l *oneConnListener) Accept() (net.Conn, error) {
	c := l.conn
	if c == nil {
		return nil, net.ErrClosed
	}
	l.conn = nil
	return c, nil
}

func (l *oneConnListener) Close() error { return nil }

func (l *oneConnListener) Addr() net.Addr { return &net.TCPAddr{} }
