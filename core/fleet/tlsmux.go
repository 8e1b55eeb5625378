// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"slices"
	"sync"

	"google.golang.org/grpc/credentials"

	"github.com/capyctl/capyctl/core/fleet/linkwire"
	"github.com/capyctl/capyctl/core/pki"
)

// The conversations of the cluster listener, by ALPN.
//
// Join and renewal are HTTP/1.1 (net/http closes a connection whose ALPN
// is another it has no handler for): a joining host offers capyctl-join/1
// to get the join config (no client certificate) and both sides then agree
// on http/1.1; a renewal is http/1.1 with the host's certificate.
const (
	ALPNJoin  = linkwire.ALPNJoin
	ALPNLink  = linkwire.ALPNLink
	ALPNRelay = linkwire.ALPNRelay
	ALPNHTTP1 = linkwire.ALPNHTTP1
)

// clusterTLS is the cluster listener's config: a joining host (ALPN
// capyctl-join/1) gets the join config, every other conversation the
// mutual TLS one with the revocation check on every handshake. peer gives
// the config of another server's conversation (servers.go; nil: not one).
func clusterTLS(a *pki.Authority, peer func(*tls.ClientHelloInfo) *tls.Config) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			if c := peer(hi); c != nil {
				return c, nil
			}
			if slices.Contains(hi.SupportedProtos, ALPNJoin) {
				c := a.JoinServerTLS()
				c.NextProtos = []string{ALPNHTTP1}
				return c, nil
			}
			c := a.ServerTLS()
			c.NextProtos = []string{ALPNLink, ALPNRelay, ALPNHTTP1}
			return c, nil
		},
	}
}

// connQueue is a net.Listener fed with connections the cluster listener
// already accepted and shook hands with.
type connQueue struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{ch: make(chan net.Conn), done: make(chan struct{}), addr: addr}
}

// push hands c to the listener's Accept; false once it is closed.
func (q *connQueue) push(ctx context.Context, c net.Conn) bool {
	select {
	case q.ch <- c:
		return true
	case <-q.done:
		return false
	case <-ctx.Done():
		return false
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }

// handshaken is gRPC's transport credentials for connections the cluster
// listener already shook hands with: it hands gRPC the TLS state (the
// host's verified certificate) without a second handshake.
type handshaken struct{}

func (handshaken) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("fleet: server-side credentials only")
}

func (handshaken) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil, errors.New("fleet: the host link needs a TLS connection")
	}
	return c, credentials.TLSInfo{State: tc.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (handshaken) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.3"}
}

func (h handshaken) Clone() credentials.TransportCredentials { return h }

func (handshaken) OverrideServerName(string) error { return nil }
