// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Defaults of ListenerOptions.
const (
	DefaultReadHeaderTimeout            = 10 * time.Second
	DefaultIdleTimeout                  = 60 * time.Second
	DefaultBodyReadTimeout              = 60 * time.Second
	DefaultMaxConnections               = 4096
	DefaultMaxUnauthenticatedPerAddress = 512
)

// ListenerOptions bound the connections of one listener (inference or
// management) and the HTTP server on it.
type ListenerOptions struct {
	// Name says which listener, in logs ("inference", "management").
	Name string
	// ReadHeaderTimeout bounds a request's head, the first one of a new
	// connection included (a connection that sends nothing is closed).
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no next
	// request.
	IdleTimeout time.Duration
	// BodyReadTimeout bounds the time a whole request body may take to
	// arrive (management bodies here; the router applies it to inference
	// bodies).
	BodyReadTimeout time.Duration
	// MaxConnections caps the listener's open connections (0: no cap).
	MaxConnections int
	// MaxUnauthenticatedPerAddress caps the connections of one remote
	// address that have not yet carried an authenticated request (0: no
	// cap).
	MaxUnauthenticatedPerAddress int
	// EvictIdle makes a connection over a cap close the oldest connection
	// (of its address, for the per-address cap) that has not sent a byte
	// yet, instead of being refused: a flood of idle connections then
	// holds only the newest ones, and a client that sends its request at
	// once, as every HTTP client does, is served. The management
	// listener's dashboard relies on it (any local user can open
	// connections to loopback).
	EvictIdle bool
	Logger    hclog.Logger
}

// WithDefaults fills the zero durations with the defaults. Zero caps stay
// zero (no cap): callers that want the default caps set them.
func (o ListenerOptions) WithDefaults() ListenerOptions {
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.BodyReadTimeout <= 0 {
		o.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	return o
}

// LimitListener counts a listener's connections and refuses those past its
// caps: past MaxConnections, and past MaxUnauthenticatedPerAddress
// connections of one remote address that carried no authenticated request
// yet. A refused connection is accepted and closed at once (with a reset),
// not left in the kernel's accept backlog: a full backlog makes every
// client, the legitimate ones included, hang on connect with no answer,
// while a reset tells a client at once to retry, and the slots come back as
// the header, idle and body deadlines drop the connections that hold them.
type LimitListener struct {
	net.Listener
	o ListenerOptions

	mu      sync.Mutex
	open    int
	unauth  map[string]int // remote address -> connections not yet authenticated
	idle    list.List      // with EvictIdle: the connections that sent nothing yet, oldest first
	full    bool           // the cap was reached and logged
	refused int64
	evicted int64
}

// NewLimitListener wraps ln.
func NewLimitListener(ln net.Listener, o ListenerOptions) *LimitListener {
	o = o.WithDefaults()
	return &LimitListener{Listener: ln, o: o, unauth: map[string]int{}}
}

// Accept returns the next connection within the caps.
func (l *LimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		t := &trackedConn{Conn: c, l: l, addr: remoteHost(c.RemoteAddr())}
		why, victim := l.admit(t)
		if victim != nil {
			victim.evict()
		}
		if why != "" {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset: nothing left in TIME_WAIT
			}
			_ = c.Close()
			continue
		}
		return t, nil
	}
}

// admit counts a new connection, or says why it is refused; victim is a
// connection that sent nothing yet whose slot it took (EvictIdle), which
// the caller closes.
func (l *LimitListener) admit(t *trackedConn) (why string, victim *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	addr := t.addr
	addrFull := l.o.MaxUnauthenticatedPerAddress > 0 && l.unauth[addr] >= l.o.MaxUnauthenticatedPerAddress
	switch {
	case l.o.MaxConnections > 0 && l.open >= l.o.MaxConnections:
		scope := "" // any address's, unless this one is at its own cap too
		if addrFull {
			scope = addr
		}
		if victim = l.oldestIdleLocked(scope); victim != nil {
			break
		}
		l.refused++
		if !l.full {
			l.full = true
			l.o.Logger.Warn("listener at its connection cap: new connections are refused until some close",
				"listener", l.o.Name, "address", l.Addr().String(), "max_connections", l.o.MaxConnections)
		}
		return "max_connections", nil
	case addrFull:
		if victim = l.oldestIdleLocked(addr); victim != nil {
			break
		}
		l.refused++
		l.o.Logger.Debug("connection refused: too many unauthenticated connections from its address",
			"listener", l.o.Name, "remote", addr, "max_unauthenticated_per_address", l.o.MaxUnauthenticatedPerAddress)
		return "max_unauthenticated_per_address", nil
	}
	if victim != nil {
		l.releaseLocked(victim) // its slot is the newcomer's
		l.evicted++
	}
	l.open++
	l.unauth[addr]++
	t.counted = true
	if l.o.EvictIdle {
		t.elem = l.idle.PushBack(t)
	}
	return "", victim
}

// oldestIdleLocked is the oldest connection (of addr; any for "") that
// sent nothing yet, nil without EvictIdle or when there is none.
func (l *LimitListener) oldestIdleLocked(addr string) *trackedConn {
	for e := l.idle.Front(); e != nil; e = e.Next() {
		if t := e.Value.(*trackedConn); addr == "" || t.addr == addr {
			return t
		}
	}
	return nil
}

// releaseLocked gives a connection's slot back, once.
func (l *LimitListener) releaseLocked(c *trackedConn) {
	if !c.counted {
		return
	}
	c.counted = false
	l.open--
	if !c.auth {
		l.dropUnauth(c.addr)
	}
	if c.elem != nil {
		l.idle.Remove(c.elem)
		c.elem = nil
	}
	if l.full && l.open < l.o.MaxConnections {
		l.full = false
	}
}

func (l *LimitListener) dropUnauth(addr string) {
	if n := l.unauth[addr] - 1; n > 0 {
		l.unauth[addr] = n
	} else {
		delete(l.unauth, addr)
	}
}

// Open returns the number of open connections.
func (l *LimitListener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Unauthenticated returns the open connections of addr (an IP address) not
// yet authenticated.
func (l *LimitListener) Unauthenticated(addr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unauth[addr]
}

// Refused returns the number of connections refused since the start.
func (l *LimitListener) Refused() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}

// Evicted returns the number of idle connections closed to make room
// (EvictIdle) since the start.
func (l *LimitListener) Evicted() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.evicted
}

func remoteHost(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// trackedConn is a connection a LimitListener counts.
type trackedConn struct {
	net.Conn
	l    *LimitListener
	addr string

	started atomic.Bool // a byte was read from it
	// Under l.mu.
	counted bool          // it holds a slot
	auth    bool          // it carried an authenticated request
	elem    *list.Element // in l.idle while it sent nothing (EvictIdle)
}

// Read implements net.Conn; the first byte takes the connection off the
// idle list.
func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.started.Load() {
		c.started.Store(true)
		c.l.mu.Lock()
		if c.elem != nil {
			c.l.idle.Remove(c.elem)
			c.elem = nil
		}
		c.l.mu.Unlock()
	}
	return n, err
}

// Close implements net.Conn; the first one frees the connection's slot.
func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// evict closes a connection whose slot was given to another (with a
// reset: nothing was said on it).
func (c *trackedConn) evict() {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Conn.Close()
}

// errNoSyscallConn: the wrapped connection has no file descriptor.
var errNoSyscallConn = errors.New("the connection is not a syscall.Conn")

// SyscallConn implements syscall.Conn with the wrapped connection's.
// IMPORTANT: the router's streams taken over from net/http wait on the raw
// socket holding no buffer (core/router/hijack.go); hiding it would cost
// every open stream a read buffer.
func (c *trackedConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errNoSyscallConn
}

// markAuthenticated records that the connection carried an authenticated
// request.
func (c *trackedConn) markAuthenticated() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.auth || !c.counted {
		return
	}
	c.auth = true
	c.l.dropUnauth(c.addr)
}

type connKey struct{}

// connContext puts a counted connection in its requests' context
// (http.Server.ConnContext).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if t, ok := c.(*trackedConn); ok {
		return context.WithValue(ctx, connKey{}, t)
	}
	return ctx
}

// markAuthenticated records that the request's connection is authenticated.
func markAuthenticated(r *http.Request) {
	if t, ok := r.Context().Value(connKey{}).(*trackedConn); ok {
		t.markAuthenticated()
	}
}

// NewServer returns the HTTP server of a listener: header, idle and (for
// management bodies) body deadlines, HTTP/1.1 only, and its connections
// known to the auth checks (a LimitListener's). Serve it on a
// LimitListener, wrapped in TLS or not.
//
// IMPORTANT: no ReadTimeout or WriteTimeout. They would hold for a whole
// request on the connection, streams included, and net/http's read that
// watches for a hang-up after the body would cancel a long stream. Bodies
// get a deadline of their own, cleared once they are read (the router's
// readBody; BodyDeadline for management).
func NewServer(h http.Handler, o ListenerOptions) *http.Server {
	o = o.WithDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		IdleTimeout:       o.IdleTimeout,
		ConnContext:       connContext,
		// HTTP/1.1 only, over TLS too: every connection is one client's, so
		// the caps, the 401 that closes the connection and the router's
		// stream handling apply as they are.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		// A client's failed handshake or bad request is no operator's
		// concern: debug level.
		ErrorLog: o.Logger.Named(o.Name).StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
	}
}

// closeUnread answers without reading the request's body and closes the
// connection after the answer: net/http would otherwise read what is left
// of the body (up to 256 KiB) before the answer, or after it to reuse the
// connection, as slowly as the client sends it. Call before writing.
func closeUnread(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	// A deadline in the past: what net/http still reads of this request
	// fails at once.
	_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
}

// BodyDeadline bounds the time a request's body may take to arrive; the
// deadline is cleared once the body is read. The management listener's
// server uses it (the router bounds inference bodies itself).
func BodyDeadline(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// IMPORTANT: a request without a body has net/http's hang-up read
		// running already; a deadline would cut it (the event stream).
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			_ = rc.SetReadDeadline(time.Now().Add(timeout))
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, w: w}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody clears the read deadline at the body's end, and closes the
// connection after a body that failed.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	w    http.ResponseWriter
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.done {
		b.done = true
		if errors.Is(err, io.EOF) {
			_ = b.rc.SetReadDeadline(time.Time{})
		} else {
			b.w.Header().Set("Connection", "close")
		}
	}
	return n, err
}
