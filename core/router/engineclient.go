// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/sdk/engineapi"
)

// engineClient is a small HTTP/1.1 client for the engines' loopback
// endpoints: one request per connection at a time, keep-alive connections
// pooled per address, no goroutine per connection.
//
// Why not http.Transport: the Transport runs two goroutines and two 4 KiB
// buffers per connection and hands every response through channels. The
// router keeps thousands of streams open at once and wants to add almost
// nothing to each answer; here a request costs one writev, the handler's
// own goroutine reads the answer, and an idle stream holds no buffer (see
// sseReader).
type engineClient struct {
	dialer  net.Dialer
	maxIdle int

	mu   sync.Mutex
	idle map[string][]net.Conn
	// live are the addresses of the engines the route table has ready
	// (retain): a connection to another one is not pooled. nil: every
	// address is.
	live map[string]bool

	// closers are the addresses of engines seen closing their connection
	// right after a streamed answer (llama-server does, whatever its head
	// says): learnClose.
	closers map[string]bool

	// stale counts pooled connections found closed by the engine (before
	// use, or by a request that was then sent again).
	stale atomic.Int64
	// assembledReads counts the reads of the engine's connection made for
	// complete answers assembled from a stream (learnClose); with the
	// low-water mark, only those the kernel woke the relay for
	// (sseReader.reads).
	assembledReads atomic.Int64
}

func newEngineClient(maxIdlePerAddr int) *engineClient {
	return &engineClient{
		dialer:  net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle: maxIdlePerAddr,
		idle:    map[string][]net.Conn{},
	}
}

// readerPool holds the readers of answer heads; a call returns its reader
// once the head is read (SSE) or the body is (JSON, errors). A reader is
// as large as the relay's event buffer: the read that brings the head
// brings as much of the answer as the relay's next read would (an engine
// that wrote its answer at once has it in the socket), and the relay's
// first flush carries it all.
var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, eventBufSize) }}

var headPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// postRequest is the request ReadResponse is given (only its method
// matters).
var postRequest = &http.Request{Method: http.MethodPost}

// cutter ends a request's engine work from any goroutine: it records the
// first cause and closes the engine connection, which is how engines learn
// that a request was abandoned. A call attaches its connection while it
// uses it and detaches it before pooling it, so a late cut never closes a
// connection another request has taken.
type cutter struct {
	mu    sync.Mutex
	cause error
	conn  net.Conn
}

// cut records cause (the first one wins) and closes the attached
// connection.
func (c *cutter) cut(cause error) {
	c.mu.Lock()
	if c.cause == nil {
		c.cause = cause
		if c.conn != nil {
			_ = c.conn.Close()
		}
	}
	c.mu.Unlock()
}

// attach makes conn the connection a cut closes; a request cut already
// closes conn and returns the cause.
func (c *cutter) attach(conn net.Conn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause != nil {
		_ = conn.Close()
		return c.cause
	}
	c.conn = conn
	return nil
}

// detach forgets the connection; false when a cut closed it.
func (c *cutter) detach() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn = nil
	return c.cause == nil
}

// err is the cut's cause, nil while the request was not cut.
func (c *cutter) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}

// engineCall is one request in flight on an engine connection.
type engineCall struct {
	cl    *engineClient
	addr  string
	conn  net.Conn
	br    *bufio.Reader
	cut   *cutter
	close bool // the engine will close the connection after this answer
	// Resp is the engine's answer head; its Body reads from the connection
	// (the SSE relay reads the connection itself: newSSEReader).
	Resp *http.Response
	// Sent is true once the request was written (the engine may have it).
	Sent bool
}

// errEngineClosed marks a connection the engine closed before answering.
var errEngineClosed = errors.New("the engine closed the connection before answering")

// engineTarget is where a request goes.
type engineTarget struct {
	addr string // host:port
	path string
}

func parseEngineURL(base, path string) (engineTarget, error) {
	if rest, ok := strings.CutPrefix(base, engineapi.UnixScheme); ok {
		// addr is the escaped socket path: a valid Host header, the pool's
		// key, and what conn dials (unixSocketAddr).
		host, prefix, _ := strings.Cut(rest, "/")
		if _, err := engineapi.UnixSocketFromHost(host); err != nil {
			return engineTarget{}, err
		}
		if prefix != "" {
			prefix = "/" + prefix
		}
		return engineTarget{addr: host, path: prefix + path}, nil
	}
	if rest, ok := strings.CutPrefix(base, engineapi.NetnsScheme); ok {
		// addr is "<pid>.<ticks>.netns.invalid:<port>": a valid Host
		// header, the pool's key, and what conn dials in the engine's
		// network namespace (netnsAddr).
		host, prefix, _ := strings.Cut(rest, "/")
		if _, ok := engineapi.ParseNetnsHost(host); !ok {
			return engineTarget{}, errors.New("bad namespaced engine address " + host)
		}
		if prefix != "" {
			prefix = "/" + prefix
		}
		return engineTarget{addr: host, path: prefix + path}, nil
	}
	u, err := url.Parse(base)
	if err != nil {
		return engineTarget{}, err
	}
	if u.Scheme != "http" {
		return engineTarget{}, errors.New("engine endpoint must be http on loopback, not " + u.Scheme)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	p := u.Path
	if p == "/" {
		p = ""
	}
	return engineTarget{addr: host, path: p + path}, nil
}

// unixSocketAddr decodes the address of an engine on a Unix socket (an
// escaped absolute path, "%2F..."); false for host:port. Only a dial pays
// for it: pooled connections are reused without it.
func unixSocketAddr(addr string) (string, bool) {
	if !strings.HasPrefix(addr, "%2F") {
		return "", false
	}
	p, err := engineapi.UnixSocketFromHost(addr)
	return p, err == nil
}

// do sends a POST with a JSON body and reads the answer's head. The
// connection's deadline is set to deadline (the request's bound until its
// first output); cut closes the connection, which is how engines learn that
// a request was abandoned; ctx bounds a dial. extra holds "Name: value\r\n"
// lines.
//
// A pooled connection is checked before it is used (alive): engines close
// connections on their own, llama-server after every streamed answer while
// its head still says keep-alive. A request that failed on a reused
// connection before the engine answered anything, with the signs of a
// connection the engine had closed (end of file, reset, broken pipe), is
// sent again once on a new connection: the engine closed that connection
// before it read the request, so it never had it. The call's Sent says
// whether the engine may have the request: false when no connection was
// made, or when the request never left CapyCTL.
func (cl *engineClient) do(ctx context.Context, t engineTarget, extra, body []byte, deadline time.Time, cut *cutter) (*engineCall, error) {
	hp := headPool.Get().(*[]byte)
	head := (*hp)[:0]
	head = append(head, "POST "...)
	head = append(head, t.path...)
	head = append(head, " HTTP/1.1\r\nHost: "...)
	head = append(head, t.addr...)
	head = append(head, "\r\nContent-Type: application/json\r\nAccept: text/event-stream, application/json\r\nContent-Length: "...)
	head = strconv.AppendInt(head, int64(len(body)), 10)
	head = append(head, "\r\n"...)
	head = append(head, extra...)
	head = append(head, "\r\n"...)
	defer func() { *hp = head[:0]; headPool.Put(hp) }()

	fresh := false
	for {
		conn, reused, err := cl.conn(ctx, t.addr, deadline, fresh)
		if err != nil {
			return &engineCall{}, err
		}
		if err := cut.attach(conn); err != nil {
			return &engineCall{}, err
		}
		call := &engineCall{cl: cl, addr: t.addr, conn: conn, cut: cut}
		// Every call sets its own deadline before any I/O, so what a pooled
		// connection's last user left there never matters.
		_ = conn.SetDeadline(deadline)
		bufs := net.Buffers{head, body}
		_, werr := bufs.WriteTo(conn)
		// Only a whole request can reach the engine's handler: one cut off
		// while being written is a malformed request the engine drops.
		call.Sent = werr == nil
		if werr == nil {
			call.br = readerPool.Get().(*bufio.Reader)
			call.br.Reset(conn)
			call.Resp, err = http.ReadResponse(call.br, postRequest)
			if err == nil {
				call.close = call.Resp.Close
				return call, nil
			}
			werr = err
		}
		answered := call.br != nil && call.br.Buffered() > 0
		call.finish(false)
		if c := cut.err(); c != nil {
			return call, c
		}
		if reused && !answered && staleConnErr(werr) {
			cl.stale.Add(1)
			fresh = true
			continue
		}
		return call, werr
	}
}

// staleConnErr reports errors of a keep-alive connection the engine had
// closed.
func staleConnErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// conn returns an idle connection to addr that is still open, or a new one
// dialed before deadline (always a new one when fresh).
func (cl *engineClient) conn(ctx context.Context, addr string, deadline time.Time, fresh bool) (net.Conn, bool, error) {
	for !fresh {
		cl.mu.Lock()
		list := cl.idle[addr]
		if len(list) == 0 {
			cl.mu.Unlock()
			break
		}
		c := list[len(list)-1]
		cl.idle[addr] = list[:len(list)-1]
		cl.mu.Unlock()
		if alive(c) {
			return c, true, nil
		}
		cl.stale.Add(1)
		_ = c.Close()
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	network, dial := "tcp", addr
	if sock, ok := unixSocketAddr(addr); ok {
		network, dial = "unix", sock
	} else if ns, ok := engineapi.ParseNetnsHost(addr); ok {
		c, err := engineapi.DialNetns(ctx, ns)
		return c, false, err
	}
	c, err := cl.dialer.DialContext(ctx, network, dial)
	return c, false, err
}

// releaseReader returns the head's reader to its pool; the bytes it had
// buffered are lost.
func (c *engineCall) releaseReader() {
	if c.br != nil {
		c.br.Reset(nil)
		readerPool.Put(c.br)
		c.br = nil
	}
}

// finish ends the call: a connection whose answer was read to its end is
// kept for the next request; any other is closed.
func (c *engineCall) finish(reusable bool) {
	if c.conn == nil {
		return
	}
	if !c.cut.detach() {
		reusable = false // cut: the connection is closed already
	}
	if c.close {
		reusable = false
	}
	if c.br != nil && c.br.Buffered() > 0 {
		reusable = false
	}
	c.releaseReader()
	conn := c.conn
	c.conn = nil
	if reusable {
		c.cl.mu.Lock()
		if len(c.cl.idle[c.addr]) < c.cl.maxIdle && (c.cl.live == nil || c.cl.live[c.addr]) {
			c.cl.idle[c.addr] = append(c.cl.idle[c.addr], conn)
			c.cl.mu.Unlock()
			return
		}
		c.cl.mu.Unlock()
	}
	_ = conn.Close()
}

// closesAfterStream reports whether the call's engine was seen closing
// its connection right after a streamed answer.
func (c *engineCall) closesAfterStream() bool {
	if c.cl == nil {
		return false
	}
	c.cl.mu.Lock()
	defer c.cl.mu.Unlock()
	return c.cl.closers[c.addr]
}

// learnClose learns, at the end of an answer assembled from the engine's
// stream (read by sr), whether the engine closes its connection after a
// stream, and reports whether the connection may be pooled. A connection
// read to its end is looked at once (a peek): closed already, the engine
// is one that closes. One read with the low-water mark whose end came on
// the clock (sseReader.readLow), on a connection still open, was not: the
// engine is taken off the list, and its next answers are gathered again.
func (c *engineCall) learnClose(sr *sseReader) bool {
	if c.cl != nil {
		c.cl.assembledReads.Add(int64(sr.reads))
	}
	switch {
	case c.cl == nil || c.conn == nil:
		return sr.reusable()
	case sr.low:
		if sr.clocked && alive(c.conn) {
			c.cl.setCloses(c.addr, false)
		}
		return false
	case sr.reusable() && !alive(c.conn):
		c.cl.setCloses(c.addr, true)
		return false
	}
	return sr.reusable()
}

func (cl *engineClient) setCloses(addr string, closes bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if closes {
		if cl.closers == nil {
			cl.closers = map[string]bool{}
		}
		cl.closers[addr] = true
	} else {
		delete(cl.closers, addr)
	}
}

// closeIdle closes every pooled connection.
func (cl *engineClient) closeIdle() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for addr, list := range cl.idle {
		for _, c := range list {
			c.Close()
		}
		delete(cl.idle, addr)
	}
}
