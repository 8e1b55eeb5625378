// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// Defaults of ServerOptions.
const (
	DefaultHeartbeat = 2 * time.Second
	// lostAfterBeats is how many heartbeat intervals without a word make a
	// host lost.
	lostAfterBeats   = 3
	handshakeTimeout = 10 * time.Second
)

// ServerOptions configure the server's side of the fleet.
type ServerOptions struct {
	// StateDir holds the CA and the join tokens (<state_dir>/pki,
	// owner-only).
	StateDir string
	// Listen is the cluster listener's address (cluster_listen).
	Listen string
	// Advertise is the address hosts dial, printed with join tokens; empty:
	// the bound address (with this machine's name for a wildcard).
	Advertise string
	Store     *store.Store
	Logger    hclog.Logger
	// Heartbeat is the interval hosts send heartbeats at (0: 2 s).
	Heartbeat time.Duration
	// GroupStallTimeout bounds a group's bring-up (0: 120 s).
	GroupStallTimeout time.Duration
	// HostCertLifetime is a host certificate's validity (0: pki's 24 h).
	HostCertLifetime time.Duration

	// A cluster of servers (servers.go): none unless BootstrapExpect > 1
	// or Join is set.
	// Name is this server's name in the cluster (hostname).
	Name string
	// BootstrapExpect is the number of servers the operator expects
	// (bootstrap_expect; 1: a server alone).
	BootstrapExpect int
	// Join is the cluster address of a server to join (server_join) and
	// JoinToken the server join token its first start redeems.
	Join      string
	JoinToken string
	// OpenRaft opens the raft node (raftlog.OpenFleet).
	OpenRaft func(RaftConfig) (RaftNode, error)
	// Responses keeps the Responses API's stored responses of the
	// requests this server takes (responses.go); nil keeps none.
	Responses ResponseStore
}

// Server is the server's side: the cluster listener, the hosts' links and
// relays, the state machine.
type Server struct {
	o      ServerOptions
	logger hclog.Logger
	auth   *pki.Authority
	State  *State

	ln        net.Listener
	advertise string
	grpcSrv   *grpc.Server
	linkQ     *connQueue
	joinSrv   *http.Server
	joinQ     *connQueue
	renewSrv  *http.Server
	renewQ    *connQueue

	mu    sync.Mutex
	hosts map[string]*liveHost
	turn  uint // rotates the relay's ties

	metrics  http.Handler
	adoptMu  sync.Mutex   // one adoption, placement, deletion or removal at a time
	taken    atomic.Int64 // streams taken over from net/http (relay.go)
	receipts api.Receipts // the Idempotency-Key receipts of the server's own mutations
	// lastStatus keeps each host's last answer for a deployment (mgmt.go).
	lastStatus statusCache
	// groups serialises the operations on each group (group.go).
	groups groupOps
	// cl is the cluster of servers (servers.go); nil: this server alone.
	cl *cluster
	// gate bounds the cluster listener's unverified connections and
	// refused counts what it turns away (gate.go).
	gate    *handshakeGate
	refused *refusalLog

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	hostv1.UnimplementedHostLinkServer
}

// liveHost is what the server knows of a host's link and relay now.
type liveHost struct {
	name       string
	addr       string
	version    string
	inventory  *hostv1.Inventory
	readings   []*hostv1.LedgerReading
	journals   map[string]*hostv1.InstanceJournal
	lastSeen   time.Time
	certExpiry time.Time

	linkGen    uint64
	linkCancel context.CancelFunc // nil: no link
	adoptDue   bool               // an adoption is scheduled
	relay      *http2.ClientConn
	relayConn  net.Conn
	inFlight   int64
}

// NewServer opens the CA (creating it on the first start), the join token
// store and the state machine, and binds the cluster listener.
func NewServer(o ServerOptions) (*Server, error) {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.GroupStallTimeout <= 0 {
		o.GroupStallTimeout = DefaultGroupStallTimeout
	}
	dir := filepath.Join(o.StateDir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, structs.Wrap(structs.CodeInvalidConfig, err, "create %s", dir)
	}
	if o.Join != "" && !pki.HasCA(dir) {
		if err := fetchClusterCA(o, dir, o.Logger.Named("fleet")); err != nil {
			return nil, err
		}
	}
	ca, err := pki.LoadOrCreateCA(dir, nil)
	if err != nil {
		return nil, err
	}
	tokens, err := pki.NewFileStore(filepath.Join(dir, "tokens.json"))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, structs.Wrap(structs.CodeAddressInUse, err, "cluster_listen %s is taken by another process: stop it, or choose another address with --cluster-listen", o.Listen)
	}
	if err != nil {
		return nil, structs.Wrap(structs.CodeInvalidConfig, err, "cluster_listen %s", o.Listen)
	}
	advertise := o.Advertise
	if advertise == "" {
		advertise = advertiseOf(ln.Addr().String())
	}
	state, err := OpenState(o.Store)
	if err != nil {
		ln.Close()
		return nil, err
	}
	names, ips := serverNames(advertise)
	auth, err := pki.NewAuthority(pki.AuthorityOptions{CA: ca, Store: tokens, ServerNames: names, ServerIPs: ips, HostCertLifetime: o.HostCertLifetime,
		Member: func(name string) bool { _, ok := state.Host(name); return ok }})
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{o: o, logger: o.Logger.Named("fleet"), auth: auth, State: state, ln: ln, advertise: advertise, hosts: map[string]*liveHost{},
		lastStatus: statusCache{m: map[string]wire.DeploymentStatus{}}}
	s.gate, s.refused = newHandshakeGate(defaultGateLimits), newRefusalLog(s.logger, refusalLogInterval)
	s.metrics = s.metricsHandler()
	s.receipts = api.Receipts{Store: o.Store, Logger: s.logger}
	if o.clustered() {
		if err := s.openCluster(ca, dir); err != nil {
			ln.Close()
			return nil, err
		}
	}
	return s, nil
}

// advertiseOf turns a bound address into one hosts can dial: a wildcard
// host becomes this machine's name.
func advertiseOf(bound string) string {
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return bound
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		} else {
			host = "127.0.0.1"
		}
	}
	return net.JoinHostPort(host, port)
}

// serverNames are the server certificate's SANs: the advertised host, and
// loopback for hosts on the same machine.
func serverNames(advertise string) ([]string, []net.IP) {
	host, _, _ := net.SplitHostPort(advertise)
	names := []string{"localhost"}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			ips = append(ips, ip)
		}
	} else if host != "" && host != "localhost" {
		names = append(names, host)
	}
	return names, ips
}

// Addr is the cluster listener's bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Advertise is the address hosts dial.
func (s *Server) Advertise() string { return s.advertise }

// CAFingerprint is the hex SHA-256 of the CA certificate.
func (s *Server) CAFingerprint() string { return s.auth.CA().FingerprintHex() }

// Start serves the cluster listener until Close.
func (s *Server) Start() {
	s.ctx, s.cancel = context.WithCancel(context.Background())
	addr := s.ln.Addr()
	s.linkQ, s.joinQ, s.renewQ = newConnQueue(addr), newConnQueue(addr), newConnQueue(addr)
	s.grpcSrv = grpc.NewServer(grpc.Creds(handshaken{}))
	hostv1.RegisterHostLinkServer(s.grpcSrv, s)
	quiet := log.New(io.Discard, "", 0)
	// A join or a renewal is one small request: a connection that does not
	// send it at once, or idles after it, is closed (the join listener takes
	// connections without a certificate).
	s.joinSrv = &http.Server{Handler: http.HandlerFunc(s.serveJoin), ReadHeaderTimeout: handshakeTimeout, ReadTimeout: handshakeTimeout,
		WriteTimeout: handshakeTimeout, IdleTimeout: handshakeTimeout, MaxHeaderBytes: 16 << 10, ErrorLog: quiet}
	s.renewSrv = &http.Server{Handler: http.HandlerFunc(s.serveRenew), ReadHeaderTimeout: handshakeTimeout, ReadTimeout: handshakeTimeout,
		WriteTimeout: handshakeTimeout, IdleTimeout: handshakeTimeout, MaxHeaderBytes: 16 << 10, ErrorLog: quiet}
	s.goRun(func() { _ = s.grpcSrv.Serve(s.linkQ) })
	s.goRun(func() { _ = s.joinSrv.Serve(s.joinQ) })
	s.goRun(func() { _ = s.renewSrv.Serve(s.renewQ) })
	s.startCluster()
	s.goRun(s.accept)
	s.goRun(func() { s.refused.run(s.ctx) })
	s.goRun(s.watchLost)
	s.goRun(s.superviseGroups)
	if s.cl != nil {
		s.goRun(s.renewPeerLoop)
	}
}

func (s *Server) goRun(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// Close stops the listener and every link and relay. The hosts' engines
// keep running; the hosts reconnect to the next server start.
func (s *Server) Close() {
	if s.cancel == nil {
		s.ln.Close()
		s.closeCluster()
		return
	}
	s.cancel()
	s.ln.Close()
	s.closeCluster()
	s.mu.Lock()
	for _, h := range s.hosts {
		if h.relayConn != nil {
			h.relayConn.Close()
		}
		if h.linkCancel != nil {
			h.linkCancel()
		}
	}
	s.mu.Unlock()
	s.grpcSrv.Stop()
	_ = s.joinSrv.Close()
	_ = s.renewSrv.Close()
	s.linkQ.Close()
	s.joinQ.Close()
	s.renewQ.Close()
	s.wg.Wait()
}

// accept takes each connection through its handshake (off the accept
// loop), within the gate's bounds (gate.go), and hands it on by ALPN.
func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		slot, refused, evicted := s.gate.admit(c)
		if evicted != "" {
			s.refused.note(evicted, remoteIP(c.RemoteAddr()))
		}
		if slot == nil {
			s.refused.note(refused, remoteIP(c.RemoteAddr()))
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset: nothing left in TIME_WAIT
			}
			c.Close()
			continue
		}
		go s.handshake(&gatedConn{Conn: c, slot: slot})
	}
}

func (s *Server) handshake(raw *gatedConn) {
	tc := tls.Server(raw, clusterTLS(s.auth, s.peerTLS))
	_ = tc.SetDeadline(time.Now().Add(handshakeDeadline))
	if err := tc.HandshakeContext(s.ctx); err != nil {
		s.logger.Debug("cluster handshake refused", "remote", raw.RemoteAddr().String(), "error", err)
		s.refused.note(refusedHandshake, remoteIP(raw.RemoteAddr()))
		raw.Close()
		return
	}
	_ = tc.SetDeadline(time.Time{})
	cs := tc.ConnectionState()
	if len(cs.PeerCertificates) > 0 {
		// A certificate of this CA: a host or a server. Its traffic is
		// outside the gate, and its address is known from now on.
		s.gate.verifiedFrom(raw.RemoteAddr())
		raw.slot.release()
	}
	switch cs.NegotiatedProtocol {
	case ALPNHTTP1:
		q := s.joinQ // no client certificate: the join config
		if len(cs.PeerCertificates) > 0 {
			q = s.renewQ
		}
		if !q.push(s.ctx, tc) {
			tc.Close()
		}
	case ALPNLink:
		if !s.linkQ.push(s.ctx, tc) {
			tc.Close()
		}
	case ALPNRelay:
		s.attachRelay(tc, cs)
	default:
		if !s.handoffPeer(tc, cs.NegotiatedProtocol) {
			tc.Close()
		}
	}
}

// ---------------------------------------------------------------- join and renew

// JoinRequest is the body of a host's POST /join.
type JoinRequest struct {
	Token    string `json:"token"`
	CSR      []byte `json:"csr"`
	Previous []byte `json:"previous,omitempty"`
}

// JoinAnswer is the answer to a join or a renewal: the host certificate's
// and the CA's DER.
type JoinAnswer struct {
	Certificate []byte `json:"certificate"`
	CA          []byte `json:"ca"`
}

func (s *Server) serveJoin(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/join" {
		writeLinkError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
		return
	}
	var req JoinRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "the join request is not valid JSON: %v", err))
		return
	}
	if err := s.leaderOnly(); err != nil { // join tokens live on the leader that made them
		writeLinkError(w, err)
		return
	}
	iss, err := s.auth.Enroll(pki.EnrollRequest{Token: req.Token, CSR: req.CSR, Previous: req.Previous})
	if err != nil {
		s.logger.Debug("join refused", "remote", r.RemoteAddr, "code", string(structs.AsError(err).Code))
		s.refused.note("join_refused:"+string(structs.AsError(err).Code), ipOf(r.RemoteAddr))
		writeLinkError(w, err)
		return
	}
	name := iss.Certificate.Subject.CommonName
	if err := s.State.Apply(Command{Op: OpHostJoined, Host: name}); err != nil {
		writeLinkError(w, err)
		return
	}
	s.event("host_joined", name, map[string]any{"remote": r.RemoteAddr, "certificate_expires": iss.Certificate.NotAfter})
	s.logger.Info("host joined", "host", name, "remote", r.RemoteAddr)
	writeJSONAnswer(w, JoinAnswer{Certificate: iss.Certificate.Raw, CA: iss.CA})
}

func (s *Server) serveRenew(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/renew" || r.TLS == nil {
		writeLinkError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
		return
	}
	csr, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "read the renewal: %v", err))
		return
	}
	// A host the (replicated) state no longer has was removed, on this
	// server or another: it renews nowhere.
	if pc := r.TLS.PeerCertificates; len(pc) > 0 {
		if _, member := s.State.Host(pc[0].Subject.CommonName); !member {
			writeLinkError(w, structs.Errf(structs.CodeHostRevoked, "host %s was removed from the cluster: join it again with a new token", pc[0].Subject.CommonName))
			return
		}
	}
	iss, err := s.auth.Renew(*r.TLS, csr)
	if err != nil {
		writeLinkError(w, err)
		return
	}
	s.mu.Lock()
	if h := s.hosts[iss.Certificate.Subject.CommonName]; h != nil {
		h.certExpiry = iss.Certificate.NotAfter
	}
	s.mu.Unlock()
	writeJSONAnswer(w, JoinAnswer{Certificate: iss.Certificate.Raw, CA: iss.CA})
}

func writeJSONAnswer(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// writeLinkError answers a join or renewal with the catalogue's envelope.
func writeLinkError(w http.ResponseWriter, err error) {
	e := structs.AsError(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(wire.HTTPStatus(e.Code))
	_ = json.NewEncoder(w).Encode(wire.ErrorEnvelope{APIVersion: wire.APIVersion,
		Error: wire.ErrorBody{Code: string(e.Code), Message: e.Message, Retryable: e.Info().Retryable, Details: e.Details}})
}

// NewJoinToken makes a one-time join token (api.Fleet).
func (s *Server) NewJoinToken(hostName string, ttl time.Duration) (wire.JoinToken, error) {
	tok, err := s.auth.NewJoinTokenFor(hostName, ttl)
	if err != nil {
		return wire.JoinToken{}, err
	}
	return wire.JoinToken{Token: tok, ExpiresAt: time.Now().UTC().Add(ttl), CAFingerprint: s.CAFingerprint(),
		HostName: hostName, ClusterAddress: s.advertise}, nil
}

// ---------------------------------------------------------------- relay

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
	t := &http2.Transport{ReadIdleTimeout: 10 * time.Second, PingTimeout: 5 * time.Second}
	cc, err := t.NewClientConn(tc)
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
	h.relay, h.relayConn = cc, tc
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
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

// ---------------------------------------------------------------- host link

// Connect serves one host's link (hostv1.HostLinkServer).
func (s *Server) Connect(stream hostv1.HostLink_ConnectServer) error {
	name, err := peerHostName(stream.Context())
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	refuse := func(err error) error {
		e := structs.AsError(err)
		_ = stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Welcome{Welcome: &hostv1.Welcome{
			Code: string(e.Code), Message: e.Message, ServerTimeUnixMs: time.Now().UnixMilli(), Protocol: 1}}})
		return nil
	}
	switch {
	case hello == nil:
		return refuse(structs.Errf(structs.CodeInvalidRequest, "the first message on a host link is Hello"))
	case hello.GetProtocol() != 1:
		return refuse(structs.Errf(structs.CodeInvalidRequest, "this server speaks host link protocol 1, the host %d", hello.GetProtocol()))
	case hello.GetHostName() != name:
		s.logger.Warn("host name changed", "certificate", name, "hello", hello.GetHostName())
		return refuse(structs.Errf(structs.CodeHostNameChanged, "this host's certificate names %q and it now calls itself %q; run it with its old name, or remove the host and join again",
			name, hello.GetHostName()))
	}
	if _, known := s.State.Host(name); !known {
		return refuse(structs.Errf(structs.CodeHostRevoked, "host %q is not a member of this server (removed); join again with a new token", name))
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	var expiry time.Time
	if cert := peerCert(stream.Context()); cert != nil {
		expiry = cert.NotAfter
	}
	s.mu.Lock()
	if _, member := s.State.Host(name); !member { // removed meanwhile
		s.mu.Unlock()
		return refuse(structs.Errf(structs.CodeHostRevoked, "host %q was removed from this server; join again with a new token", name))
	}
	h := s.hostLocked(name)
	if h.linkCancel != nil {
		h.linkCancel() // one link per host: the newer one wins
	}
	h.linkGen++
	gen := h.linkGen
	wasLost := !h.lastSeen.IsZero()
	h.linkCancel, h.addr, h.version, h.inventory = cancel, peerAddr(stream.Context()), hello.GetVersion(), hello.GetInventory()
	h.lastSeen, h.certExpiry = time.Now(), expiry
	h.journals = map[string]*hostv1.InstanceJournal{}
	for _, j := range hello.GetInstances() {
		h.journals[j.GetInstanceId()] = j
	}
	addr := h.addr
	s.mu.Unlock()
	defer s.linkDown(name, gen)
	if wasLost {
		s.event("host_reconnected", name, map[string]any{"instances": len(hello.GetInstances())})
	}
	s.adoptLater(name)
	s.logger.Info("host link up", "host", name, "address", addr, "instances", len(hello.GetInstances()))
	// The cluster's servers: the host keeps a link and a relay to each
	// (any server routes to it, the leader commands it), and hears of a
	// change of the configuration on this link.
	members := s.clusterServers()
	if err := stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Welcome{Welcome: &hostv1.Welcome{
		Accepted: true, ServerTimeUnixMs: time.Now().UnixMilli(), HeartbeatIntervalMs: s.o.Heartbeat.Milliseconds(), Protocol: 1,
		Cluster: members}}}); err != nil {
		return err
	}
	var membersTick <-chan time.Time
	if s.cl != nil {
		t := time.NewTicker(s.o.Heartbeat)
		defer t.Stop()
		membersTick = t.C
	}
	msgs := make(chan *hostv1.HostMessage)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-membersTick:
			if now := s.clusterServers(); !sameServers(now, members) {
				members = now
				if err := stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Servers{Servers: now}}); err != nil {
					return err
				}
			}
		case m := <-msgs:
			s.onHostMessage(name, gen, m)
			if err := stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Ack{Ack: &hostv1.Ack{Seq: m.GetSeq()}}}); err != nil {
				return err
			}
		}
	}
}

// clusterServers is the raft configuration as hosts see it: this
// server's name and every member's cluster address; nil for a server
// alone.
func (s *Server) clusterServers() *hostv1.ClusterServers {
	if s.cl == nil {
		return nil
	}
	st := s.cl.node.Status()
	out := &hostv1.ClusterServers{Self: s.cl.name}
	for _, m := range st.Servers {
		out.Servers = append(out.Servers, &hostv1.ClusterServer{Name: m.ID, Address: m.Address})
	}
	sort.Slice(out.Servers, func(i, j int) bool { return out.Servers[i].GetName() < out.Servers[j].GetName() })
	return out
}

// sameServers reports whether two lists of servers name the same members
// at the same addresses.
func sameServers(a, b *hostv1.ClusterServers) bool {
	if len(a.GetServers()) != len(b.GetServers()) {
		return false
	}
	for i, m := range a.GetServers() {
		o := b.GetServers()[i]
		if m.GetName() != o.GetName() || m.GetAddress() != o.GetAddress() {
			return false
		}
	}
	return true
}

// onHostMessage applies one message of a host's link; a host's events are
// journalled in the order it sent them.
func (s *Server) onHostMessage(name string, gen uint64, m *hostv1.HostMessage) {
	if ev := m.GetEvent(); ev != nil {
		payload := map[string]any{"instance": ev.GetInstanceId(), "message": ev.GetMessage(), "host_time_unix_ms": ev.GetTimeUnixMs()}
		for k, v := range ev.GetAttributes() {
			if _, taken := payload[k]; !taken {
				payload[k] = v
			}
		}
		s.event(ev.GetKind(), name, payload)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[name]
	if h == nil || h.linkGen != gen {
		return
	}
	h.lastSeen = time.Now()
	switch b := m.GetBody().(type) {
	case *hostv1.HostMessage_Heartbeat:
		h.readings = b.Heartbeat.GetReadings()
		if inv := b.Heartbeat.GetInventory(); inv != nil {
			h.inventory = inv
		}
	case *hostv1.HostMessage_Journal:
		j := b.Journal
		if j.GetState() == string(structs.StateStopped) && j.GetDeployment() == "" {
			delete(h.journals, j.GetInstanceId())
		} else {
			h.journals[j.GetInstanceId()] = j
			if _, placed := s.State.Placement(j.GetDeployment()); !placed {
				s.adoptLaterLocked(h) // a deployment made on the host itself
			}
		}
	}
}

// adoptLater runs adopt for a host once, in the background, unless one is
// already due for it.
func (s *Server) adoptLater(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[name]; h != nil {
		s.adoptLaterLocked(h)
	}
}

// adoptLaterLocked is adoptLater with mu held.
func (s *Server) adoptLaterLocked(h *liveHost) {
	if h.adoptDue || s.ctx == nil || s.ctx.Err() != nil {
		return
	}
	// Only the leader changes the state: a follower a host is linked to
	// leaves its deployments to the leader, which has a link of its own
	// (and adopts again for every linked host when it is elected).
	if s.leaderOnly() != nil {
		return
	}
	h.adoptDue = true
	name := h.name
	s.goRun(func() {
		s.mu.Lock()
		h.adoptDue = false
		s.mu.Unlock()
		s.adopt(s.ctx, name)
	})
}

// adopt places on the server the deployments a host runs that the server
// has no placement for (deployed on the host itself, or a machine that ran
// standalone before it joined), so that they are listed and routed; a
// deployment the server placed on other hosts only is left alone and
// logged. It waits for the host's relay to ask for each one's routes.
func (s *Server) adopt(ctx context.Context, host string) {
	s.adoptMu.Lock()
	defer s.adoptMu.Unlock()
	counts := map[string]int{}
	s.mu.Lock()
	if h := s.hosts[host]; h != nil {
		for _, j := range h.journals {
			if j.GetDeployment() != "" {
				counts[j.GetDeployment()]++
			}
		}
	}
	s.mu.Unlock()
	for dep, n := range counts {
		if p, ok := s.State.Placement(dep); ok {
			if !slices.Contains(p.HostNames(), host) {
				s.logger.Warn("a host runs a deployment the server placed on other hosts; not adopted", "host", host, "deployment", dep, "hosts", p.HostNames())
			}
			continue
		}
		var st wire.DeploymentStatus
		// The relay comes up just after the link; a host whose relay does
		// not within 10 s is tried again at its next journal or Hello.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if ctx.Err() != nil || time.Now().After(deadline) {
				return
			}
			status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(dep), nil, nil)
			if err == nil && status == http.StatusOK && json.Unmarshal(data, &st) == nil {
				break
			}
			if err == nil && status == http.StatusNotFound {
				st.Name = ""
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		if st.Name == "" {
			continue
		}
		if st.Spec != nil && st.Spec.Group != nil {
			// A member of a group the server has no placement for (one
			// whose placement was undone): one rank alone never serves.
			s.logger.Warn("a host runs a group member the server has no placement for; not adopted (capyctl --address HOST delete deployment NAME on the host)",
				"host", host, "deployment", dep, "rank", st.Spec.Group.Rank)
			continue
		}
		p := &Placement{Deployment: dep, Hosts: []HostShare{{Host: host, Instances: n}}, Routes: st.Routes, Revision: st.Revision, At: time.Now().UTC()}
		if err := s.State.Apply(Command{Op: OpPlaced, Placement: p}); err != nil {
			s.logger.Warn("adopt a host's deployment", "host", host, "deployment", dep, "error", err)
			continue
		}
		s.logger.Info("adopted a deployment the host runs", "host", host, "deployment", dep, "instances", n)
		s.event("deployment_adopted", host, map[string]any{"deployment": dep, "instances": n})
	}
}

// linkDown marks a host's link down when the link of generation gen ends.
func (s *Server) linkDown(name string, gen uint64) {
	s.mu.Lock()
	h := s.hosts[name]
	if h == nil || h.linkGen != gen || h.linkCancel == nil {
		s.mu.Unlock()
		return
	}
	h.linkCancel = nil
	relay := h.relayConn
	h.relay, h.relayConn = nil, nil
	s.mu.Unlock()
	if relay != nil {
		relay.Close()
	}
	if s.ctx.Err() == nil {
		s.logger.Warn("host link down: its instances are uncertain until it comes back", "host", name)
		s.event("host_lost", name, nil)
	}
}

// watchLost ends the link of a host silent for lostAfterBeats heartbeat
// intervals (a partition may leave the TCP connection open).
func (s *Server) watchLost() {
	t := time.NewTicker(s.o.Heartbeat)
	defer t.Stop()
	leader := false
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		// A server newly elected adopts what its linked hosts run that no
		// placement names (a follower leaves that to the leader).
		if s.cl != nil {
			was := leader
			if leader = s.leaderOnly() == nil; leader && !was {
				s.mu.Lock()
				for _, h := range s.hosts {
					if h.linkCancel != nil {
						s.adoptLaterLocked(h)
					}
				}
				s.mu.Unlock()
			}
		}
		now := time.Now()
		limit := now.Add(-lostAfterBeats * s.o.Heartbeat)
		s.mu.Lock()
		for _, h := range s.hosts {
			if h.linkCancel != nil && h.lastSeen.Before(limit) {
				h.linkCancel()
			}
			// A connection outlives the certificate it was opened with:
			// once that expired, the host must come back with a renewed one.
			if !h.certExpiry.IsZero() && now.After(h.certExpiry) {
				if h.linkCancel != nil {
					h.linkCancel()
				}
				if h.relayConn != nil {
					h.relayConn.Close()
				}
			}
		}
		s.mu.Unlock()
	}
}

// event appends a fleet event to the server's journal.
func (s *Server) event(kind, host string, payload map[string]any) {
	if payload == nil {
		payload = map[string]any{}
	}
	payload["host"] = host
	if _, err := s.o.Store.AppendEvent(&structs.Event{At: time.Now().UTC(), Kind: kind, Payload: payload}); err != nil {
		s.logger.Warn("record a fleet event", "kind", kind, "error", err)
	}
}

// ---------------------------------------------------------------- host records (api.Fleet)

// Hosts lists every joined host with its link's figures.
func (s *Server) Hosts() []wire.Host {
	out := []wire.Host{}
	for _, rec := range s.State.Hosts() {
		out = append(out, s.hostView(rec))
	}
	return out
}

func (s *Server) hostView(rec HostRecord) wire.Host {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := wire.Host{Name: rec.Name, Role: "host", State: wire.HostLost}
	h := s.hosts[rec.Name]
	if h == nil {
		return v
	}
	v.Address, v.Version = h.addr, h.version
	if !h.lastSeen.IsZero() {
		t := h.lastSeen.UTC()
		v.LastSeen = &t
	}
	if !h.certExpiry.IsZero() {
		t := h.certExpiry.UTC()
		v.CertExpiresAt = &t
	}
	up := h.linkCancel != nil && relayUp(h.relay)
	v.Online = up
	switch {
	case !up:
		v.State = wire.HostLost
	case rec.Drained:
		v.State = wire.HostDraining
	default:
		v.State = wire.HostReady
	}
	used := map[string]int64{}
	for _, r := range h.readings {
		v.ChargedBytes += r.GetChargedBytes()
		used[r.GetDeviceUuid()] = r.GetUsedBytes()
	}
	for _, c := range h.inventory.GetCards() {
		v.GPUs = append(v.GPUs, wire.GPU{Index: int(c.GetIndex()), UUID: c.GetUuid(), Name: c.GetName(), TotalBytes: c.GetMemoryBytes(),
			UsedBytes: used[c.GetUuid()], Unified: h.inventory.GetUnified()})
	}
	for _, e := range h.inventory.GetEngines() {
		v.Engines = append(v.Engines, e.GetName())
	}
	ledger := map[string]any{}
	for _, r := range h.readings {
		ledger[r.GetDomain()] = map[string]any{"capacity_bytes": r.GetCapacityBytes(), "used_bytes": r.GetUsedBytes(),
			"external_bytes": r.GetExternalBytes(), "charged_bytes": r.GetChargedBytes()}
	}
	if len(ledger) > 0 {
		v.Ledger = ledger
	}
	return v
}

// Host returns one host's record and instances (api.Fleet).
func (s *Server) Host(name string) (wire.HostDetail, error) {
	rec, ok := s.State.Host(name)
	if !ok {
		return wire.HostDetail{}, structs.Errf(structs.CodeNotFound, "no host %s (capyctl list hosts)", name)
	}
	d := wire.HostDetail{Host: s.hostView(rec)}
	s.mu.Lock()
	if h := s.hosts[name]; h != nil {
		for _, j := range h.journals {
			d.Instances = append(d.Instances, wire.HostInstance{Deployment: j.GetDeployment(), InstanceID: j.GetInstanceId(),
				State: j.GetState(), Since: time.UnixMilli(j.GetSinceUnixMs()).UTC(), Charges: j.GetCharges()})
		}
	}
	s.mu.Unlock()
	sort.Slice(d.Instances, func(i, j int) bool { return d.Instances[i].InstanceID < d.Instances[j].InstanceID })
	return d, nil
}

// Drain stops or resumes new placements on a host (api.Fleet).
func (s *Server) Drain(name string, drain bool) error {
	if _, ok := s.State.Host(name); !ok {
		return structs.Errf(structs.CodeNotFound, "no host %s (capyctl list hosts)", name)
	}
	if err := s.State.Apply(Command{Op: OpHostDrain, Host: name, Drain: drain}); err != nil {
		return err
	}
	kind := "host_drained"
	if !drain {
		kind = "host_resumed"
	}
	s.event(kind, name, nil)
	return nil
}

// Remove revokes a host's certificate, ends its link and relay and forgets
// it (api.Fleet). Deployments placed on it must be moved or deleted
// first.
func (s *Server) Remove(name string) error {
	s.adoptMu.Lock() // no placement or adoption naming it meanwhile
	defer s.adoptMu.Unlock()
	if _, ok := s.State.Host(name); !ok {
		return structs.Errf(structs.CodeNotFound, "no host %s (capyctl list hosts)", name)
	}
	var deps []string
	for _, p := range s.State.Placements() {
		for _, hs := range p.Hosts {
			if hs.Host == name {
				deps = append(deps, p.Deployment)
			}
		}
	}
	if len(deps) > 0 {
		return structs.Errf(structs.CodeConflict, "host %s runs %s: delete or move them first (capyctl delete deployment NAME)", name, strings.Join(deps, ", ")).
			WithDetail("deployments", deps)
	}
	if err := s.auth.Revoke(name); err != nil {
		return structs.Wrap(structs.CodeStoreUnavailable, err, "revoke host %s", name)
	}
	if err := s.State.Apply(Command{Op: OpHostRemoved, Host: name}); err != nil {
		return err
	}
	s.mu.Lock()
	h := s.hosts[name]
	delete(s.hosts, name)
	s.mu.Unlock()
	if h != nil {
		if h.linkCancel != nil {
			h.linkCancel()
		}
		if h.relayConn != nil {
			h.relayConn.Close()
		}
	}
	s.event("host_removed", name, nil)
	return nil
}

// placeable returns the most free card memory of a host (its ledger's
// room less its charges, as its last heartbeat said) and whether it takes
// placements (link and relay up, not draining).
func (s *Server) placeable(name string) (free int64, ok bool) {
	rec, known := s.State.Host(name)
	if !known || rec.Drained {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[name]
	if h == nil || h.linkCancel == nil || !relayUp(h.relay) {
		return 0, false
	}
	for _, r := range h.readings {
		if strings.HasPrefix(r.GetDomain(), "gpu") || r.GetDomain() == "unified" {
			room := r.GetRoomBytes()
			if room == 0 {
				room = r.GetCapacityBytes()
			}
			if f := room - r.GetChargedBytes(); f > free {
				free = f
			}
		}
	}
	return free, true
}

func (s *Server) String() string { return fmt.Sprintf("fleet server on %s", s.Addr()) }
