// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/linkwire"
	"github.com/capyctl/capyctl/core/fleet/raftlog"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// Defaults of ServerOptions.
const (
	DefaultHeartbeat = linkwire.DefaultHeartbeat
	// lostAfterBeats is how many heartbeat intervals without a word make a
	// host lost.
	lostAfterBeats = 3
	// linkWedgedBeats is how many heartbeat intervals without a word on
	// its link make a host lost even while its relay delivers chunks (a
	// stuck heartbeat goroutine or a half-open link connection).
	linkWedgedBeats  = 20 * lostAfterBeats
	handshakeTimeout = linkwire.HandshakeTimeout
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
	// RescheduleAfter is how long the leader waits for a lost host before
	// it places the host's instances on other hosts (0: never).
	RescheduleAfter time.Duration
	// RefuseAdoption: the server adopts no deployment a host made itself
	// (adopt_host_deployments = false): a host serves only what the
	// servers placed on it.
	RefuseAdoption bool
	// HostCertLifetime is a host certificate's validity (0: pki's 24 h).
	HostCertLifetime time.Duration

	// The cluster of servers (servers.go): every server runs raft, a
	// server alone as a cluster of one voter.
	// Name is this server's name in the cluster (hostname).
	Name string
	// BootstrapExpect is the number of servers the operator intends
	// (bootstrap_expect), written into the replicated state by the first
	// server's first leadership; ignored afterwards.
	BootstrapExpect int
	// Join is the cluster address of a server to join (server_join) and
	// JoinToken the server join token its first start redeems.
	Join      string
	JoinToken string
	// RaftTuning overrides raft's timeouts (tests).
	RaftTuning raftlog.Tuning
	// Secrets are the credentials every server of the cluster shares,
	// handed to a joining server; AdoptSecrets takes them on a joining
	// server's first start (before it serves).
	Secrets      func() ClusterSecrets
	AdoptSecrets func(ClusterSecrets) error
	// Responses keeps the Responses API's stored responses of the
	// requests this server takes (responses.go); nil keeps none.
	Responses ResponseStore
	// Collectors are more series of the server's own /metrics (the keys'
	// usage of the requests this server took).
	Collectors []prometheus.Collector
	// ForwardTimeout bounds a follower's wait for the leader's answer to
	// a mutation it relayed (forwarddeadline.go; 0: GroupStallTimeout
	// plus a minute, the longest a change waits on the leader).
	ForwardTimeout time.Duration
	// hostLimits overrides defaultHostLimits (tests).
	hostLimits *hostLimits
}

// Server is the server's side: the cluster listener, the hosts' links and
// relays, the state machine.
type Server struct {
	o      ServerOptions
	logger hclog.Logger
	auth   *pki.Authority
	State  *fsm.State

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
	streams  openCount    // streams taken over from net/http (relaytaken.go)
	receipts api.Receipts // the Idempotency-Key receipts of the server's own mutations
	// lastStatus keeps each host's last answer for a deployment (mgmtstatus.go).
	lastStatus statusCache
	// statusAsks is when each was asked (journalstatus.go).
	statusAsks statusAsks
	// groups serialises the operations on each group (group.go).
	groups groupOps
	// cl is the cluster of servers (servers.go).
	cl *cluster
	// gate bounds the cluster listener's unverified connections and
	// refused counts what it turns away (gate.go).
	gate    *handshakeGate
	refused *refusalLog
	// limits bound what each host sends on its link and hostRefused
	// counts what is refused (linkbounds.go).
	limits      hostLimits
	hostRefused *refusalLog
	// leaderCtx is the context of the leader's duties while this server
	// leads and its state is the cluster's (nil otherwise), under mu;
	// leading is published when it changes.
	leaderCtx context.Context
	leading   signal
	// links is published whenever a host's link comes up or goes, or its
	// relay attaches (the host is ready for placements).
	links signal
	// journaled is published whenever a host's journal arrives (the
	// groups' supervisor waits on it) or a link comes up.
	journaled signal
	// madeWaits counts the requests waiting for their deployment's hosts
	// to make it (awaitMade).
	madeWaits atomic.Int64
	madeWait  atomic.Int64 // a time.Duration; 0: madeWait
	// hostIO is what the group code and hostCall need from the hosts:
	// linkedHosts, a fake in a test (grouphosts.go).
	hostIO memberHosts
	// fatal carries the reason the server must stop (Fatal).
	fatal chan error
	// keys is the keeper of the cluster's named keys (UseKeys), under mu.
	keys *apikeys.Keeper

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
	made       map[string]int // journals by deployment (placing; kept by put/dropJournal)
	lastSeen   time.Time
	certExpiry time.Time

	linkGen    uint64
	linkCancel context.CancelFunc // nil: no link
	adoptDue   bool               // an adoption is scheduled or running
	adoptAgain bool               // ...and another was asked for meanwhile
	relay      *http2.ClientConn
	relayConn  net.Conn
	// relayHeard is the current relay connection's clock of its last read
	// (nil: no relay): a host whose relay answers is not silent.
	relayHeard *heardClock
	inFlight   int64
	// downSince is when its link last went down (zero while up).
	downSince time.Time
	// applied is the host's last answer to its desired state; changed is
	// published when it, a journal or the link changes.
	applied *hostv1.DesiredApplied
	changed signal
	// sentIndex is the index of the last share sent on the current link;
	// sameThrough the newest index whose share was the same as that one
	// (not sent again: the host's answer to it stands for it).
	sentIndex, sameThrough uint64
	// outbox are the commands to send on the current link; pending the
	// commands waiting for their result, by command_id.
	outbox  chan *hostv1.ServerMessage
	pending map[string]chan *hostv1.CommandResult
	// guard bounds what the host sends (linkbounds.go); made on first use.
	guard *hostGuard
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
	state, err := fsm.Open(o.Store, o.Logger)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{o: o, logger: o.Logger.Named("fleet"), State: state, ln: ln, advertise: advertise, hosts: map[string]*liveHost{},
		lastStatus: statusCache{m: map[string]wire.DeploymentStatus{}}, fatal: make(chan error, 1)}
	s.hostIO = linkedHosts{s}
	s.gate, s.refused = newHandshakeGate(defaultGateLimits), newRefusalLog(s.logger, refusalLogInterval)
	s.limits, s.hostRefused = defaultHostLimits, newRefusalLog(s.logger, refusalLogInterval)
	if o.hostLimits != nil {
		s.limits = *o.hostLimits
	}
	s.hostRefused.what, s.hostRefused.by, s.hostRefused.bys = "host message refusals", "host", "hosts"
	names, ips := serverNames(advertise)
	// Join tokens and revocations are the cluster's: replicated.
	s.auth, err = pki.NewAuthority(pki.AuthorityOptions{CA: ca, Store: replicatedTokens{s}, ServerNames: names, ServerIPs: ips,
		HostCertLifetime: o.HostCertLifetime, Revoked: state.HostRevoked,
		Member: func(name string) bool { _, ok := state.Host(name); return ok }})
	if err != nil {
		ln.Close()
		return nil, err
	}
	s.metrics = s.metricsHandler()
	s.receipts = api.Receipts{Store: o.Store, Logger: s.logger}
	if err := s.openCluster(ca, dir); err != nil {
		ln.Close()
		return nil, err
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
	s.grpcSrv = grpc.NewServer(grpc.Creds(handshaken{}), grpc.MaxRecvMsgSize(s.limits.messageBytes))
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
	s.goRun(func() { s.hostRefused.run(s.ctx) })
	s.goRun(s.watchLost)
	s.goRun(s.monitorLeadership)
	s.goRun(s.watchMembers)
	s.goRun(s.renewPeerLoop)
}

// watchMembers ends, on every server, the link and relay of a host the
// replicated state no longer names (removed on any server), as soon as
// this server applies the removal.
func (s *Server) watchMembers() {
	for {
		changed := s.State.Changed()
		var gone []*liveHost
		s.mu.Lock()
		for name, h := range s.hosts {
			if _, member := s.State.Host(name); !member {
				gone = append(gone, h)
				delete(s.hosts, name)
			}
		}
		s.mu.Unlock()
		for _, h := range gone {
			if h.linkCancel != nil {
				h.linkCancel()
			}
			if h.relayConn != nil {
				h.relayConn.Close()
			}
			s.logger.Info("host no longer a member: its link and relay closed", "host", h.name)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-changed:
		}
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

func (s *Server) event(kind, host string, payload map[string]any) {
	if payload == nil {
		payload = map[string]any{}
	}
	payload["host"] = host
	if _, err := s.o.Store.AppendEvent(&structs.Event{At: time.Now().UTC(), Kind: kind, Payload: payload}); err != nil {
		s.logger.Warn("record a fleet event", "kind", kind, "error", err)
	}
}

func (s *Server) String() string { return fmt.Sprintf("fleet server on %s", s.Addr()) }
