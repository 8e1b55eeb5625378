// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"crypto/tls"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
)

// relayTransport is the HTTP/2 client of a host's relay connection: a
// connection silent for 10 s is pinged, and one whose ping is not
// answered in 5 s is closed, so a host that vanished without a FIN (its
// machine off, a cable pulled) is seen out of reach instead of holding
// every request sent to it.
func relayTransport() *http2.Transport {
	return &http2.Transport{ReadIdleTimeout: 10 * time.Second, PingTimeout: 5 * time.Second}
}

// attachRelay takes a host's relay connection: the server is the HTTP/2
// client on a connection the host opened.
func (s *Server) attachRelay(tc *tls.Conn, cs tls.ConnectionState) {
	if len(cs.PeerCertificates) == 0 {
		tc.Close()
		return
	}
	name := cs.PeerCertificates[0].Subject.CommonName
	if _, known := s.State.Host(name); !known {
		s.logger.Debug("relay from a host the server does not know", "host", name)
		s.refused.note(refusedUnknown, remoteIP(tc.RemoteAddr()))
		tc.Close()
		return
	}
	heard := &heardConn{Conn: tc, clock: &heardClock{}}
	cc, err := relayTransport().NewClientConn(heard)
	if err != nil {
		tc.Close()
		return
	}
	s.mu.Lock()
	if _, member := s.State.Host(name); !member { // removed meanwhile
		s.mu.Unlock()
		tc.Close()
		return
	}
	h := s.hostLocked(name)
	old := h.relayConn
	h.relay, h.relayConn, h.relayHeard = cc, tc, heard.clock
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
	h.changed.publish() // a wait for the host's relay (an adoption's read) goes on
	s.links.publish()   // the host takes placements again (a blocked reschedule tries it)
	s.logger.Debug("relay attached", "host", name)
}

// hostLocked returns the live record of a host, made on first use; the
// caller holds mu.
func (s *Server) hostLocked(name string) *liveHost {
	h := s.hosts[name]
	if h == nil {
		h = &liveHost{name: name, journals: map[string]*hostv1.InstanceJournal{}}
		s.hosts[name] = h
	}
	return h
}

// relayOf returns a host's relay when its link is up and its relay works.
func (s *Server) relayOf(name string) (*http2.ClientConn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[name]
	if h == nil || h.linkCancel == nil || !relayUp(h.relay) {
		return nil, false
	}
	return h.relay, true
}

// relayUp reports whether a relay connection is open. A relay with every
// stream slot taken is busy, not gone: its requests wait for a slot.
func relayUp(cc *http2.ClientConn) bool {
	if cc == nil {
		return false
	}
	st := cc.State()
	return !st.Closed && !st.Closing
}

// heardConn is a host's relay connection that keeps the time of its last
// read (a frame from the host: an answer's bytes, a ping's answer), so
// that watchLost does not take a host whose relay is answering for lost
// when its heartbeat is late. It embeds *tls.Conn: the HTTP/2 client
// still reads the connection's TLS state.
type heardConn struct {
	*tls.Conn
	clock *heardClock
}

func (c *heardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.clock.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// heardClock is when a relay connection last read something (unix
// nanoseconds; 0: never).
type heardClock struct{ last atomic.Int64 }

// since reports whether the relay read something after t (false for a nil
// clock: no relay).
func (c *heardClock) since(t time.Time) bool {
	return c != nil && c.last.Load() > t.UnixNano()
}
