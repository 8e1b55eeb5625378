// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

// A cluster of servers (raft):
//
//   - The first server starts with bootstrap_expect N (N > 1) and
//     bootstraps a configuration of itself alone; it is the leader once
//     elected. Each further server starts with server_join (the cluster
//     address of a running server) and a server join token (capyctl
//     create join-token --role server): over the cluster listener's ALPN
//     capyctl-server-join/1, pinning the CA by the token's fingerprint as
//     a host does, it receives the cluster's CA, certificate and key
//     (written owner-only: every server signs host certificates), signs
//     its own server peer certificate, opens its raft node and asks the
//     leader (ALPN capyctl-server/1, mutual TLS with server peer
//     certificates) to add it as a voter.
//   - Raft's own traffic goes over the cluster listener too (ALPN
//     capyctl-raft/1, server peer certificates only): one port per server.
//   - Every command of the state machine goes through raft
//     (State.SetLog). Join tokens stay on the server that made them, the
//     leader (a follower forwards `create join-token`); a host joins the
//     leader (the token names its address), and a follower refuses a
//     join with not_leader naming it.
//   - A follower relays every mutating management request to the leader
//     (forward.go) and answers with the leader's answer.

// ALPNs of server-to-server traffic on the cluster listener.
const (
	// ALPNRaft carries raft's RPCs (server peer certificates only).
	ALPNRaft = "capyctl-raft/1"
	// ALPNServer carries HTTP/1.1 between servers: the leader adds a
	// joining server, a follower relays mutations, list servers asks each
	// member's figures (server peer certificates only).
	ALPNServer = "capyctl-server/1"
	// ALPNServerJoin is a joining server's first request, with a server
	// join token and no client certificate.
	ALPNServerJoin = "capyctl-server-join/1"
)

// headerForwarded marks a management request a follower relayed: the
// server it reaches answers it or refuses it, never relays it again.
const headerForwarded = "X-Capyctl-Forwarded-By"

// headerIndex is the leader's last log index after it served a relayed
// mutation (indexWriter).
const headerIndex = "X-Capyctl-Raft-Index"

// appliedWait bounds a follower's wait to apply a relayed mutation's
// index before it answers.
const appliedWait = 5 * time.Second

// clusterJoinTimeout bounds a joining server's join and its addition as a
// voter (the leader waits for it to catch up).
const clusterJoinTimeout = 60 * time.Second

// RaftNode is this server's member of the raft cluster (raftlog.Node);
// raftlog opens it (ServerOptions.OpenRaft), since raftlog imports this
// package.
type RaftNode interface {
	Log
	// AddVoter and RemoveServer change the configuration (the leader's
	// calls: not_leader elsewhere).
	AddVoter(id, address string) error
	RemoveServer(id string) error
	Status() RaftStatus
	Close() error
}

// RaftStatus is a node's view of the cluster.
type RaftStatus struct {
	ID            string       `json:"id"`
	State         string       `json:"state"`
	Term          uint64       `json:"term"`
	LastIndex     uint64       `json:"last_index"`
	CommitIndex   uint64       `json:"commit_index"`
	AppliedIndex  uint64       `json:"applied_index"`
	LeaderID      string       `json:"leader_id"`
	LeaderAddress string       `json:"leader_address"`
	Servers       []RaftMember `json:"servers"`
}

// peerStatus is a server's answer to GET /status from another server.
type peerStatus struct {
	RaftStatus
	// Expect is its bootstrap_expect.
	Expect int `json:"expect"`
}

// RaftMember is one server of the configuration.
type RaftMember struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	Voter   bool   `json:"voter"`
}

// RaftConfig is what OpenRaft is given.
type RaftConfig struct {
	ID  string
	Dir string
	// Listener yields the cluster listener's raft connections, through
	// their mutual TLS handshake already.
	Listener net.Listener
	// Advertise is this server's cluster address (raft's address too).
	Advertise string
	// DialTLS dials another server's raft ALPN.
	DialTLS *tls.Config
	State   *State
	// Bootstrap: a first server with no raft state bootstraps itself alone.
	Bootstrap bool
	Logger    hclog.Logger
}

// clustered reports whether the options ask for a cluster of servers.
func (o ServerOptions) clustered() bool { return o.BootstrapExpect > 1 || o.Join != "" }

// cluster is a server's part of the cluster of servers.
type cluster struct {
	name   string
	expect int
	node   RaftNode
	ca     *pki.CA
	// creds are this server's peer certificate, renewed in place
	// (renewPeer), saved in pkiDir.
	creds  *pki.Credentials
	pkiDir string

	peerListen, peerDial *tls.Config
	raftQ, peerQ, joinQ  *connQueue
	peerSrv, joinSrv     *http.Server
	client               *http.Client
	// addDue: this start must ask the leader to add it (a joining server
	// with no raft state yet).
	addDue bool

	mu         sync.Mutex
	mgmt       http.Handler
	adminToken string
}

// serverJoinRequest is a joining server's POST /server-join.
type serverJoinRequest struct {
	Token string `json:"token"`
	Name  string `json:"name"`
}

// serverJoinAnswer carries the cluster's CA, certificate and key (PEM).
type serverJoinAnswer struct {
	CACert []byte `json:"ca_cert"`
	CAKey  []byte `json:"ca_key"`
}

// serverAddRequest is POST /server-add: the leader adds the server as a
// voter.
type serverAddRequest struct {
	Name    string `json:"name"`
	Address string `json:"address"`
}

// fetchClusterCA is a joining server's first step, before its CA is
// loaded: it redeems the server join token at the leader and installs the
// cluster's CA in dir.
func fetchClusterCA(o ServerOptions, dir string, logger hclog.Logger) error {
	if o.JoinToken == "" {
		return structs.Errf(structs.CodeInvalidConfig, "a server joining a cluster needs a server join token (capyctl create join-token --role server on a running server; --join-token-file or CAPYCTL_JOIN_TOKEN)")
	}
	tok, err := pki.ParseJoinToken(o.JoinToken)
	if err != nil {
		return err
	}
	cfg := pki.HostJoinTLS(tok.Fingerprint)
	cfg.NextProtos = []string{ALPNServerJoin}
	body, _ := json.Marshal(serverJoinRequest{Token: o.JoinToken, Name: o.Name})
	var ans serverJoinAnswer
	err = untilLeader(context.Background(), joinAddrs(o.Join), logger, func(ctx context.Context, addr string) error {
		return postJSON(ctx, dialClient(cfg), addr, "/server-join", body, &ans)
	})
	if err != nil {
		return err
	}
	if _, err := pki.InstallCA(dir, ans.CACert, ans.CAKey); err != nil {
		return err
	}
	logger.Info("joined the server cluster: received its CA", "server", o.Join)
	return nil
}

// joinAddrs splits server_join: one or more cluster addresses,
// comma-separated.
func joinAddrs(join string) []string {
	var out []string
	for _, a := range strings.Split(join, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// untilLeader calls f on the first address; a not_leader answer naming a
// leader sends the next try there, one naming none waits for the
// election, and an address out of reach (unavailable) gives way to the
// next one given. Gives up after clusterJoinTimeout.
func untilLeader(ctx context.Context, addrs []string, logger hclog.Logger, f func(ctx context.Context, addr string) error) error {
	ctx, cancel := context.WithTimeout(ctx, clusterJoinTimeout)
	defer cancel()
	if len(addrs) == 0 {
		return structs.Errf(structs.CodeInvalidConfig, "no server to join (server_join)")
	}
	next, addr := 0, addrs[0]
	for {
		err := f(ctx, addr)
		if err == nil {
			return nil
		}
		e := structs.AsError(err)
		retry := e.Code == structs.CodeNotLeader || e.Code == structs.CodeUnavailable
		if !retry {
			return err
		}
		if l, _ := e.Details["leader_address"].(string); l != "" {
			addr = l
		} else if e.Code == structs.CodeUnavailable && len(addrs) > 1 {
			next = (next + 1) % len(addrs)
			addr = addrs[next]
		}
		logger.Debug("server cluster: trying again", "address", addr, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("join the server cluster: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// renewPeer re-signs this server's peer certificate with the cluster's CA
// (every server holds it) once two thirds of its life have passed, or it
// has expired (a server stopped for long), saves it and serves it from the
// next handshake on; the other servers check it against the same CA. It
// reports whether it renewed.
func (cl *cluster) renewPeer(now time.Time) (bool, error) {
	cur := cl.creds.Current()
	if cur == nil || cur.Leaf == nil {
		return false, nil
	}
	leaf := cur.Leaf
	due := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
	if now.Before(due) {
		return false, nil
	}
	key, err := pki.NewKey()
	if err != nil {
		return false, err
	}
	iss, err := cl.ca.IssueServerPeer(pki.ServerPeerRequest{Name: cl.name, Public: key.Public(), Now: now})
	if err != nil {
		return false, err
	}
	if err := pki.SaveServerPeer(cl.pkiDir, key, iss); err != nil {
		return false, err
	}
	cl.creds.Set(key, iss)
	return true, nil
}

// renewPeerLoop checks the peer certificate at start and every hour.
func (s *Server) renewPeerLoop() {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if renewed, err := s.cl.renewPeer(time.Now()); err != nil {
			s.logger.Error("renew this server's peer certificate", "error", err)
		} else if renewed {
			s.logger.Info("server peer certificate renewed", "expires", s.cl.creds.Current().Leaf.NotAfter)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// openCluster opens this server's raft node and its server-to-server
// listeners (served from Start).
func (s *Server) openCluster(ca *pki.CA, pkiDir string) (err error) {
	o := s.o
	if o.OpenRaft == nil {
		return fmt.Errorf("fleet: a cluster of servers needs OpenRaft")
	}
	if o.Name == "" {
		return structs.Errf(structs.CodeInvalidConfig, "a server of a cluster needs a name (hostname)")
	}
	creds, err := pki.LoadServerPeer(pkiDir, ca)
	if errors.Is(err, fs.ErrNotExist) {
		key, kerr := pki.NewKey()
		if kerr != nil {
			return kerr
		}
		iss, ierr := ca.IssueServerPeer(pki.ServerPeerRequest{Name: o.Name, Public: key.Public()})
		if ierr != nil {
			return ierr
		}
		if err := pki.SaveServerPeer(pkiDir, key, iss); err != nil {
			return err
		}
		creds, err = pki.NewCredentials(key, iss), nil
	}
	if err != nil {
		return err
	}
	listen, dial := pki.ServerPeerTLS(ca.Certificate(), creds, nil)
	raftDir := filepath.Join(o.StateDir, "raft")
	_, statErr := os.Stat(filepath.Join(raftDir, "raft.db"))
	fresh := errors.Is(statErr, fs.ErrNotExist)
	addr := s.ln.Addr()
	cl := &cluster{name: o.Name, expect: o.BootstrapExpect, ca: ca, creds: creds, pkiDir: pkiDir, peerListen: listen, peerDial: dial,
		raftQ: newConnQueue(addr), peerQ: newConnQueue(addr), joinQ: newConnQueue(addr), addDue: o.Join != "" && fresh}
	if cl.expect < 1 {
		cl.expect = 1
	}
	peerCfg := dial.Clone()
	peerCfg.NextProtos = []string{ALPNServer}
	cl.client = dialClient(peerCfg)
	raftDial := dial.Clone()
	raftDial.NextProtos = []string{ALPNRaft}
	node, err := o.OpenRaft(RaftConfig{ID: o.Name, Dir: raftDir, Listener: cl.raftQ, Advertise: s.advertise, DialTLS: raftDial,
		State: s.State, Bootstrap: o.Join == "", Logger: s.logger})
	if err != nil {
		return err
	}
	cl.node = node
	s.State.SetLog(node)
	s.cl = cl
	return nil
}

// peerTLS is the cluster listener's config for a server's ALPN; nil for
// any other conversation.
func (s *Server) peerTLS(hi *tls.ClientHelloInfo) *tls.Config {
	if s.cl == nil {
		return nil
	}
	for _, p := range hi.SupportedProtos {
		switch p {
		case ALPNRaft, ALPNServer:
			c := s.cl.peerListen.Clone()
			c.NextProtos = []string{p}
			return c
		case ALPNServerJoin:
			c := s.auth.JoinServerTLS()
			c.NextProtos = []string{p}
			return c
		}
	}
	return nil
}

// handoffPeer hands a server's connection to raft or the server-to-server
// HTTP; false when this server is alone or the ALPN is not a server's.
func (s *Server) handoffPeer(tc *tls.Conn, proto string) bool {
	cl := s.cl
	if cl == nil {
		return false
	}
	switch proto {
	case ALPNRaft:
		return cl.raftQ.push(s.ctx, tc)
	case ALPNServer:
		return cl.peerQ.push(s.ctx, plainConn{tc})
	case ALPNServerJoin:
		return cl.joinQ.push(s.ctx, plainConn{tc})
	}
	return false
}

// plainConn hides a TLS connection from net/http, which serves it as plain
// HTTP/1.1 (it would otherwise close a connection whose ALPN it does not
// know).
type plainConn struct{ net.Conn }

// startCluster serves the server-to-server listeners (from Start).
func (s *Server) startCluster() {
	cl := s.cl
	if cl == nil {
		return
	}
	quiet := s.joinSrv.ErrorLog
	cl.peerSrv = &http.Server{Handler: http.HandlerFunc(s.servePeer), ReadHeaderTimeout: handshakeTimeout, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: quiet}
	cl.joinSrv = &http.Server{Handler: http.HandlerFunc(s.serveServerJoin), ReadHeaderTimeout: handshakeTimeout, ReadTimeout: handshakeTimeout,
		WriteTimeout: handshakeTimeout, IdleTimeout: handshakeTimeout, MaxHeaderBytes: 16 << 10, ErrorLog: quiet}
	s.goRun(func() { _ = cl.peerSrv.Serve(cl.peerQ) })
	s.goRun(func() { _ = cl.joinSrv.Serve(cl.joinQ) })
}

// closeCluster stops raft and the server-to-server listeners.
func (s *Server) closeCluster() {
	cl := s.cl
	if cl == nil {
		return
	}
	if cl.peerSrv != nil {
		_ = cl.peerSrv.Close()
		_ = cl.joinSrv.Close()
	}
	if err := cl.node.Close(); err != nil {
		s.logger.Warn("close the raft node", "error", err)
	}
	cl.raftQ.Close()
	cl.peerQ.Close()
	cl.joinQ.Close()
}

// JoinCluster completes this server's place in the cluster once Start
// serves the cluster listener: a joining server asks the leader to add it
// as a voter; then it waits (bounded) until a leader is known, so that the
// role starts ready to take mutations. A server alone returns at once.
func (s *Server) JoinCluster(ctx context.Context) error {
	cl := s.cl
	if cl == nil {
		return nil
	}
	if cl.addDue {
		body, _ := json.Marshal(serverAddRequest{Name: cl.name, Address: s.advertise})
		err := untilLeader(ctx, joinAddrs(s.o.Join), s.logger, func(ctx context.Context, addr string) error {
			return postJSON(ctx, cl.client, addr, "/server-add", body, nil)
		})
		if err != nil {
			return err
		}
		s.logger.Info("added to the server cluster as a voter", "name", cl.name)
	}
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if st := cl.node.Status(); st.LeaderID != "" {
			s.logger.Info("server cluster", "leader", st.LeaderID, "state", st.State, "term", st.Term)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			s.logger.Warn("no leader of the server cluster yet; mutations answer not_leader until one is elected")
			return nil
		case <-tick.C:
		}
	}
}

// ServeManagement lets the leader answer the management requests its
// followers relay: h is the management API's handler, token its admin
// token (the relay's mutual TLS authenticated the follower, which
// authenticated the operator).
func (s *Server) ServeManagement(h http.Handler, adminToken string) {
	if s.cl == nil {
		return
	}
	s.cl.mu.Lock()
	s.cl.mgmt, s.cl.adminToken = h, adminToken
	s.cl.mu.Unlock()
}

// notLeader is this server's refusal of a change only the leader makes.
func (s *Server) notLeader(st RaftStatus) *structs.Error {
	if st.LeaderID == "" {
		return structs.Errf(structs.CodeNotLeader, "server %s is not the leader and no leader is elected now; retry once one is", s.cl.name).
			WithDetail("leader_id", "").WithDetail("leader_address", "")
	}
	return structs.Errf(structs.CodeNotLeader, "server %s is not the leader; the leader is %s at %s", s.cl.name, st.LeaderID, st.LeaderAddress).
		WithDetail("leader_id", st.LeaderID).WithDetail("leader_address", st.LeaderAddress)
}

// leaderOnly returns not_leader on a follower of a cluster, nil on the
// leader or a server alone.
func (s *Server) leaderOnly() error {
	if s.cl == nil {
		return nil
	}
	if st := s.cl.node.Status(); st.State != "leader" {
		return s.notLeader(st)
	}
	return nil
}

// serveServerJoin answers a joining server: its server join token buys
// the cluster's CA.
func (s *Server) serveServerJoin(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/server-join" {
		writeLinkError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
		return
	}
	var req serverJoinRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 16<<10)).Decode(&req); err != nil {
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "the server join request is not valid JSON: %v", err))
		return
	}
	if err := s.leaderOnly(); err != nil {
		writeLinkError(w, err)
		return
	}
	for _, m := range s.cl.node.Status().Servers {
		if m.ID == req.Name {
			writeLinkError(w, structs.Errf(structs.CodeConflict, "a server named %q is a member of the cluster already; remove it first (capyctl remove server %s) or give the new one another --hostname", req.Name, req.Name))
			return
		}
	}
	if err := s.auth.RedeemServerToken(req.Token); err != nil {
		s.logger.Warn("server join refused", "remote", r.RemoteAddr, "name", req.Name, "code", string(structs.AsError(err).Code))
		writeLinkError(w, err)
		return
	}
	certPEM, keyPEM, err := s.cl.ca.EncodePEM()
	if err != nil {
		writeLinkError(w, err)
		return
	}
	s.logger.Info("a server redeemed a server join token", "name", req.Name, "remote", r.RemoteAddr)
	writeJSONAnswer(w, serverJoinAnswer{CACert: certPEM, CAKey: keyPEM})
}

// servePeer answers another server (server peer certificate verified).
func (s *Server) servePeer(w http.ResponseWriter, r *http.Request) {
	cl := s.cl
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/status":
		writeJSONAnswer(w, peerStatus{RaftStatus: cl.node.Status(), Expect: cl.expect})
	case r.Method == http.MethodPost && r.URL.Path == "/server-add":
		var req serverAddRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 16<<10)).Decode(&req); err != nil || req.Name == "" || req.Address == "" {
			writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "a server addition names the server and its address"))
			return
		}
		if err := cl.node.AddVoter(req.Name, req.Address); err != nil {
			writeLinkError(w, err)
			return
		}
		s.logger.Info("server added to the cluster", "name", req.Name, "address", req.Address)
		w.WriteHeader(http.StatusNoContent)
	case strings.HasPrefix(r.URL.Path, "/responses/"):
		s.servePeerResponses(w, r) // another server asks for a response this one holds (responses.go)
	default:
		cl.mu.Lock()
		h, token := cl.mgmt, cl.adminToken
		cl.mu.Unlock()
		if h == nil {
			writeLinkError(w, structs.Errf(structs.CodeUnavailable, "server %s is starting", cl.name))
			return
		}
		r.Header.Set("Authorization", "Bearer "+token)
		if r.Header.Get(headerForwarded) == "" {
			r.Header.Set(headerForwarded, "server")
		}
		h.ServeHTTP(&indexWriter{ResponseWriter: w, node: cl.node}, r)
	}
}

// indexWriter names, in the answer's head, the leader's last log index
// once the relayed mutation was served: the follower that relayed it
// answers its client once it applied that far, so that a read on it
// after the answer sees the change (read your writes).
type indexWriter struct {
	http.ResponseWriter
	node        RaftNode
	wroteHeader bool
}

func (w *indexWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		w.Header().Set(headerIndex, fmt.Sprint(w.node.Status().LastIndex))
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *indexWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *indexWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// ---------------------------------------------------------------- operator

// Servers lists the cluster's members, each one's figures asked of it
// (api.Servers).
func (s *Server) Servers(ctx context.Context) (wire.ServerList, error) {
	if s.cl == nil {
		return wire.ServerList{Self: s.o.Name, Leader: s.o.Name, Expect: 1, Voters: 1,
			Servers: []wire.ServerInfo{{Name: s.o.Name, Address: s.advertise, Voter: true, State: "leader"}}}, nil
	}
	cl := s.cl
	own := cl.node.Status()
	out := wire.ServerList{Raft: true, Self: cl.name, Leader: own.LeaderID, Expect: cl.expect}
	infos := make([]wire.ServerInfo, len(own.Servers))
	expects := make([]int, len(own.Servers))
	var wg sync.WaitGroup
	for i, m := range own.Servers {
		if m.Voter {
			out.Voters++
		}
		infos[i] = wire.ServerInfo{Name: m.ID, Address: m.Address, Voter: m.Voter}
		if m.ID == cl.name {
			fill(&infos[i], own)
			continue
		}
		wg.Add(1)
		go func(i int, addr string) {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			var st peerStatus
			if err := getJSON(cctx, cl.client, addr, "/status", &st); err != nil {
				infos[i].State, infos[i].Error = "unreachable", err.Error()
				return
			}
			fill(&infos[i], st.RaftStatus)
			expects[i] = st.Expect
		}(i, m.Address)
	}
	wg.Wait()
	// bootstrap_expect is the first server's setting: the largest any
	// member was started with.
	for _, e := range expects {
		out.Expect = max(out.Expect, e)
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	out.Servers = infos
	out.Degraded = out.Voters < out.Expect || out.Leader == ""
	for _, in := range infos {
		if in.State == "unreachable" && in.Voter {
			out.Degraded = true
		}
	}
	return out, nil
}

func fill(in *wire.ServerInfo, st RaftStatus) {
	in.State, in.Term, in.LastIndex, in.AppliedIndex, in.Leader = st.State, st.Term, st.LastIndex, st.AppliedIndex, st.LeaderID
}

// ClusterWarnings say what an operator should know of the cluster: fewer
// voters than bootstrap_expect, or no leader.
func (s *Server) ClusterWarnings() []string {
	if s.cl == nil {
		return nil
	}
	st := s.cl.node.Status()
	voters := 0
	for _, m := range st.Servers {
		if m.Voter {
			voters++
		}
	}
	var out []string
	if voters < s.cl.expect {
		out = append(out, fmt.Sprintf("the server cluster is degraded: %d of the %d servers bootstrap_expect names are voters (join the others: capyctl start server --join)", voters, s.cl.expect))
	}
	if st.LeaderID == "" {
		out = append(out, "the server cluster has no leader now: mutations answer not_leader until one is elected")
	}
	return out
}

// RemoveServer takes a server out of the raft configuration (api.Servers;
// the leader's call, relayed there from a follower).
func (s *Server) RemoveServer(name string) error {
	if s.cl == nil {
		return structs.Errf(structs.CodeUnsupported, "this server runs alone (no bootstrap_expect above 1, no server_join): there is no server to remove")
	}
	found := false
	for _, m := range s.cl.node.Status().Servers {
		found = found || m.ID == name
	}
	if !found {
		return structs.Errf(structs.CodeNotFound, "no server %s in the cluster (capyctl list servers)", name)
	}
	if err := s.cl.node.RemoveServer(name); err != nil {
		return err
	}
	s.event("server_removed", name, nil)
	return nil
}

// NewServerJoinToken makes a one-time token that joins a server to the
// cluster (api.Servers).
func (s *Server) NewServerJoinToken(ttl time.Duration) (wire.JoinToken, error) {
	if s.cl == nil {
		return wire.JoinToken{}, structs.Errf(structs.CodeUnsupported,
			"this server runs alone: start the cluster's first server with --bootstrap-expect N (N > 1) to let other servers join")
	}
	tok, err := s.auth.NewServerJoinToken(ttl)
	if err != nil {
		return wire.JoinToken{}, err
	}
	return wire.JoinToken{Token: tok, ExpiresAt: time.Now().UTC().Add(ttl), CAFingerprint: s.CAFingerprint(),
		ClusterAddress: s.advertise, Role: pki.TokenRoleServer}, nil
}

// ---------------------------------------------------------------- HTTP between servers

// dialClient is an HTTP/1.1 client whose connections are TLS with cfg,
// handed to net/http as plain connections (its URLs are http://ADDR/...).
func dialClient(cfg *tls.Config) *http.Client {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return plainConn{c}, nil
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Minute,
	}}
}

// postJSON posts body and decodes a 2xx answer into out (nil: none); an
// error answer comes back as its catalogue error, a failed connection as
// unavailable (retryable).
func postJSON(ctx context.Context, c *http.Client, addr, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return doJSON(c, addr, req, out)
}

func getJSON(ctx context.Context, c *http.Client, addr, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	return doJSON(c, addr, req, out)
}

func doJSON(c *http.Client, addr string, req *http.Request, out any) error {
	resp, err := c.Do(req)
	if err != nil {
		e := structs.AsError(err)
		if e.Code == structs.CodeJoinCAMismatch {
			return e
		}
		return structs.Wrap(structs.CodeUnavailable, err, "server %s", addr).WithDetail("server", addr)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return structs.Wrap(structs.CodeUnavailable, err, "read server %s's answer", addr)
	}
	if resp.StatusCode/100 != 2 {
		var env wire.ErrorEnvelope
		if json.Unmarshal(data, &env) == nil && env.Error.Code != "" {
			e := structs.Errf(structs.Code(env.Error.Code), "server %s: %s", addr, env.Error.Message)
			for k, v := range env.Error.Details {
				e = e.WithDetail(k, v)
			}
			return e
		}
		return structs.Errf(structs.CodeInternal, "server %s answered %d", addr, resp.StatusCode)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return structs.Wrap(structs.CodeInternal, err, "server %s's answer", addr)
		}
	}
	return nil
}
