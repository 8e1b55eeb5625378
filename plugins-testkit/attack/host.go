// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package attack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
)

// The cluster listener's conversations a host speaks, by ALPN (the wire's
// names, as a host offers them).
const (
	alpnLink  = "h2"
	alpnRelay = "capyctl-relay/1"
)

// HostIdentity is a joined host's key and certificate and the CA it
// pinned: what an attacker who took the host's machine holds.
type HostIdentity struct {
	// Name is the host name the certificate carries.
	Name string
	Cert tls.Certificate
	CA   *x509.Certificate
}

// StealHostIdentity reads a joined host's credentials from its state
// directory (<state_dir>/host-pki: host.key, host.crt, ca.crt).
func StealHostIdentity(stateDir string) (*HostIdentity, error) {
	dir := filepath.Join(stateDir, "host-pki")
	read := func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, name)) }
	keyPEM, err := read("host.key")
	if err != nil {
		return nil, err
	}
	certPEM, err := read("host.crt")
	if err != nil {
		return nil, err
	}
	caPEM, err := read("ca.crt")
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the host's key pair: %w", err)
	}
	b, _ := pem.Decode(caPEM)
	if b == nil {
		return nil, errors.New("ca.crt is not PEM")
	}
	ca, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, err
	}
	cert.Leaf = leaf
	return &HostIdentity{Name: leaf.Subject.CommonName, Cert: cert, CA: ca}, nil
}

// TLS is the identity's mutual TLS config for one conversation with the
// server at addr.
func (id *HostIdentity) TLS(addr, alpn string) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(id.CA)
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	cert := id.Cert
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: host, NextProtos: []string{alpn},
		Certificates: []tls.Certificate{cert}}
}

// CompromisedHost drives a server's host link and relay with a stolen
// identity.
type CompromisedHost struct {
	ID     *HostIdentity
	Server string // the server's cluster address
}

// Link is an open host link: the attacker sends what it likes.
type Link struct {
	conn    *grpc.ClientConn
	stream  hostv1.HostLink_ConnectClient
	cancel  context.CancelFunc
	mu      sync.Mutex
	seq     uint64
	Welcome *hostv1.Welcome
}

// Link opens the host link and sends hello (its Seq is set; nil: a Hello
// with the identity's name, protocol 1 and nothing else), and waits for the
// server's Welcome. The server's later messages (acks) are read and dropped
// until Close.
func (c *CompromisedHost) Link(ctx context.Context, hello *hostv1.Hello) (*Link, error) {
	if hello == nil {
		hello = &hostv1.Hello{HostName: c.ID.Name, Protocol: 1, Inventory: &hostv1.Inventory{}}
	}
	conn, err := grpc.NewClient(c.Server, grpc.WithTransportCredentials(credentials.NewTLS(c.ID.TLS(c.Server, alpnLink))))
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	stream, err := hostv1.NewHostLinkClient(conn).Connect(lctx)
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	l := &Link{conn: conn, stream: stream, cancel: cancel}
	if err := l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Hello{Hello: hello}}); err != nil {
		l.Close()
		return nil, err
	}
	type recv struct {
		m   *hostv1.ServerMessage
		err error
	}
	first := make(chan recv, 1)
	go func() {
		m, err := stream.Recv()
		first <- recv{m, err}
		if err != nil {
			return
		}
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	select {
	case r := <-first:
		if r.err != nil {
			l.Close()
			return nil, r.err
		}
		l.Welcome = r.m.GetWelcome()
		if l.Welcome == nil || !l.Welcome.GetAccepted() {
			l.Close()
			return nil, fmt.Errorf("the server did not welcome the link: %v", r.m)
		}
		return l, nil
	case <-ctx.Done():
		l.Close()
		return nil, ctx.Err()
	}
}

// Send sends one message with the link's next sequence number.
func (l *Link) Send(m *hostv1.HostMessage) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	m.Seq = l.seq
	return l.stream.Send(m)
}

// Beat sends a heartbeat with readings every interval until the link
// closes, so the server keeps the link up (a host silent for three
// intervals is lost).
func (l *Link) Beat(every time.Duration, readings []*hostv1.LedgerReading) {
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-l.stream.Context().Done():
				return
			case <-t.C:
			}
			hb := &hostv1.Heartbeat{TimeUnixMs: time.Now().UnixMilli(), Readings: readings}
			if err := l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Heartbeat{Heartbeat: hb}}); err != nil {
				return
			}
		}
	}()
}

// Close ends the link.
func (l *Link) Close() {
	_ = l.stream.CloseSend()
	l.cancel()
	l.conn.Close()
}

// ServeRelay opens the relay and serves handler on it (the server asks,
// the attacker answers) until stop, or until the server closes it.
func (c *CompromisedHost) ServeRelay(handler http.Handler) (stop func(), err error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: c.ID.TLS(c.Server, alpnRelay)}
	conn, err := d.DialContext(context.Background(), "tcp", c.Server)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv := &http2.Server{}
		srv.ServeConn(conn, &http2.ServeConnOpts{Context: ctx, Handler: handler, BaseConfig: &http.Server{}})
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			conn.Close()
			<-done
		})
	}, nil
}
