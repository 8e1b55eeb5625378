// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package raftlog

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// defaultHandshakeTimeout bounds a TLS handshake between servers when raft
// gives no timeout of its own (an accepted connection).
const defaultHandshakeTimeout = 10 * time.Second

// tlsStream is raft's StreamLayer over mutual TLS: the listener takes TCP
// connections and serves TLS on them with listen; Dial dials with dial.
// Both configs come from pki.ServerPeerTLS, so each end verifies the other
// against the cluster's CA.
type tlsStream struct {
	ln        net.Listener
	listen    *tls.Config
	dial      *tls.Config
	advertise net.Addr
	timeout   time.Duration
	// handshaken: ln's connections are TLS already (Options.Handshaken).
	handshaken bool

	mu       sync.Mutex
	closed   bool
	accepted map[*trackedConn]struct{}
}

var _ raft.StreamLayer = (*tlsStream)(nil)

// Accept returns the next connection; its handshake runs on its first read
// or write (in raft's goroutine for the connection, not in the accept
// loop), bounded by the handshake timeout.
func (s *tlsStream) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	if !s.handshaken {
		c = &serverConn{Conn: tls.Server(c, s.listen), timeout: s.timeout}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	if s.accepted == nil {
		s.accepted = map[*trackedConn]struct{}{}
	}
	tc := &trackedConn{Conn: c, s: s}
	s.accepted[tc] = struct{}{}
	return tc, nil
}

// Close closes the listener and every connection it accepted: raft's
// transport reads each one on a goroutine of its own, which ends only
// when its connection does.
func (s *tlsStream) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.closed = true
	conns := s.accepted
	s.accepted = nil
	s.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
	return err
}

// trackedConn is an accepted connection the stream closes with itself.
type trackedConn struct {
	net.Conn
	s    *tlsStream
	once sync.Once
}

// Close closes the connection and forgets it.
func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.accepted, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// Addr is the address the other servers dial (raft records it as this
// server's).
func (s *tlsStream) Addr() net.Addr { return s.advertise }

// Dial opens a connection to another server and completes the handshake:
// a server whose certificate is not a server peer's of this CA fails here.
// With TLS 1.3 the other end checks this server's certificate after the
// client finished: a refusal shows on the first read, which fails raft's
// RPC the same way.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 {
		timeout = s.timeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := &tls.Dialer{NetDialer: &net.Dialer{}, Config: s.dial}
	return d.DialContext(ctx, "tcp", string(address))
}

// serverConn is an accepted connection whose handshake runs, once, before
// its first read or write, with a deadline.
type serverConn struct {
	*tls.Conn
	timeout time.Duration
	once    sync.Once
	err     error
}

func (c *serverConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		c.err = c.Conn.HandshakeContext(ctx)
	})
	return c.err
}

// Read implements net.Conn.
func (c *serverConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

// Write implements net.Conn.
func (c *serverConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// tcpAddr is an advertised address as raft records it.
type tcpAddr string

func (a tcpAddr) Network() string { return "tcp" }
func (a tcpAddr) String() string  { return string(a) }
