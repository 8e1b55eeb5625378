// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/fleet/raftlog"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// The cluster of servers (raft), always on: a server alone is a cluster of
// one voter, so every server runs one code path (as Nomad's and Consul's
// do).
//
//   - A server with no raft state and no server_join bootstraps a
//     configuration of itself alone and leads it at once. Its first
//     leadership writes the cluster's own record (bootstrap_expect: the
//     size the operator intends, which every server reads from the state
//     and not from its own flags) and, for a server that ran without
//     raft before (an upgrade), carries the state it holds into the log
//     as one restored command, so that servers that join later replay it.
//   - A server with raft state always starts from it, with or without
//     flags: server_join and bootstrap_expect are for the first start. A
//     server whose raft configuration no longer names it (it was removed,
//     or renamed) refuses to start, saying so.
//   - A further server starts with server_join (the cluster address of a
//     running server) and a server join token: over the cluster
//     listener's ALPN capyctl-server-join/1, pinning the CA by the token's
//     fingerprint as a host does, it receives the cluster's CA,
//     certificate and key (written owner-only: every server signs host
//     certificates), signs its own server peer certificate, opens its raft
//     node and asks the leader (ALPN capyctl-server/1, mutual TLS with
//     server peer certificates) to add it as a voter.
//   - Raft's own traffic goes over the cluster listener too (ALPN
//     capyctl-raft/1, server peer certificates only): one port per server.
//   - Leader-only work (adopting what hosts report, supervising groups)
//     starts when raft says this server leads and stops when it stops
//     leading, under a context of its own (leader.go).
//   - A follower relays every mutating management request to the leader
//     (forward.go) and answers once it applied the leader's index.

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

// metaCarryDue marks, in the store's meta bucket, a state this server held
// before it ran raft: its first leadership carries it into the log.
const metaCarryDue = "fleet_carry_due"

// cluster is a server's part of the cluster of servers.
type cluster struct {
	name string
	node *raftlog.Node
	ca   *pki.CA
	// creds are this server's peer certificate, renewed in place
	// (renewPeer), saved in pkiDir.
	creds  *pki.Credentials
	pkiDir string

	peerListen, peerDial *tls.Config
	raftQ, peerQ, joinQ  *connQueue
	peerSrv, joinSrv     *http.Server
	client               *http.Client
	// addDue: this start must ask the leader to add it (a joining server
	// not in any configuration yet).
	addDue bool

	mu         sync.Mutex
	mgmt       http.Handler
	adminToken string
}

// openCluster opens this server's raft node and its server-to-server
// listeners (served from Start).
func (s *Server) openCluster(ca *pki.CA, pkiDir string) error {
	o := s.o
	if o.Name == "" {
		return structs.Errf(structs.CodeInvalidConfig, "a server needs a name (hostname)")
	}
	creds, err := serverPeerCreds(ca, pkiDir, o.Name)
	if err != nil {
		return err
	}
	raftDir := filepath.Join(o.StateDir, "raft")
	_, statErr := os.Stat(filepath.Join(raftDir, raftlog.LogFile))
	fresh := errors.Is(statErr, fs.ErrNotExist)
	if fresh {
		if err := s.prepareFreshState(); err != nil {
			return err
		}
	}
	// A removed server's name is refused on every server-to-server
	// connection (its certificate is still the CA's).
	listen, dial := pki.ServerPeerTLSRefusing(ca.Certificate(), creds, nil, s.serverRefused)
	addr := s.ln.Addr()
	cl := &cluster{name: o.Name, ca: ca, creds: creds, pkiDir: pkiDir, peerListen: listen, peerDial: dial,
		raftQ: newConnQueue(addr), peerQ: newConnQueue(addr), joinQ: newConnQueue(addr)}
	peerCfg := dial.Clone()
	peerCfg.NextProtos = []string{ALPNServer}
	cl.client = dialClient(peerCfg)
	raftDial := dial.Clone()
	raftDial.NextProtos = []string{ALPNRaft}
	ro := raftlog.Options{ID: o.Name, Dir: raftDir, Listener: cl.raftQ, Advertise: s.advertise, DialTLS: raftDial, Handshaken: true,
		State: s.State, Tuning: o.RaftTuning, Logger: s.logger}
	if fresh && o.Join == "" {
		ro.Bootstrap = []raftlog.Peer{{ID: o.Name, Address: s.advertise}}
	}
	node, err := raftlog.Open(ro)
	if err != nil {
		return err
	}
	members := node.Stats().Servers
	if err := checkMember(o.Name, s.advertise, o.Join, members); err != nil {
		_ = node.Close()
		return err
	}
	cl.node, cl.addDue = node, len(members) == 0
	s.State.SetLog(node)
	s.cl = cl
	return nil
}

// serverPeerCreds loads this server's peer certificate, signing one with
// the cluster's CA on the first start.
func serverPeerCreds(ca *pki.CA, pkiDir, name string) (*pki.Credentials, error) {
	creds, err := pki.LoadServerPeer(pkiDir, ca)
	if !errors.Is(err, fs.ErrNotExist) {
		return creds, err
	}
	key, err := pki.NewKey()
	if err != nil {
		return nil, err
	}
	iss, err := ca.IssueServerPeer(pki.ServerPeerRequest{Name: name, Public: key.Public()})
	if err != nil {
		return nil, err
	}
	if err := pki.SaveServerPeer(pkiDir, key, iss); err != nil {
		return nil, err
	}
	return pki.NewCredentials(key, iss), nil
}

// prepareFreshState looks at the state a server holds before its first
// start with raft: a server that ran alone before raft was always on
// carries it into the log at its first leadership; a server that joins a
// cluster must hold none (the cluster's log would replace it).
func (s *Server) prepareFreshState() error {
	// A new log starts at index 1: entries at or below an index the store
	// recorded for an earlier log would be skipped as replays.
	if err := s.State.ResetApplied(); err != nil {
		return err
	}
	if s.State.Empty() {
		return nil
	}
	hosts, placements := len(s.State.Hosts()), len(s.State.Placements())
	if s.o.Join != "" {
		return structs.Errf(structs.CodeInvalidConfig,
			"this server holds a state of its own (%d hosts, %d placements) and would lose it by joining a cluster; start it without server_join (it keeps its state and other servers join it), or move its state directory away",
			hosts, placements).WithDetail("hosts", hosts).WithDetail("placements", placements)
	}
	s.logger.Info("this server's state goes into the replicated log at its first leadership", "hosts", hosts, "placements", placements)
	if err := s.o.Store.SetMeta(metaCarryDue, "1"); err != nil {
		return structs.Wrap(structs.CodeStoreUnavailable, err, "record the state to carry into the log")
	}
	return nil
}

// checkMember refuses a server whose raft configuration does not name it:
// it was removed from the cluster, or its name changed. An empty
// configuration is a joining server's before its addition.
func checkMember(name, advertise, join string, members []raftlog.Server) error {
	if len(members) == 0 {
		if join == "" {
			return structs.Errf(structs.CodeInvalidConfig,
				"this server has raft state but belongs to no cluster configuration (a join that did not finish): start it with server_join to join one, or move <state_dir>/raft away")
		}
		return nil
	}
	var names []string
	for _, m := range members {
		if m.ID == name {
			return nil
		}
		names = append(names, m.ID)
		if m.Address == advertise {
			return structs.Errf(structs.CodeHostNameChanged,
				"this server's raft state knows it as %q, and it now calls itself %q: start it with --hostname %s", m.ID, name, m.ID).
				WithDetail("previous", m.ID).WithDetail("name", name)
		}
	}
	return structs.Errf(structs.CodeServerRemoved,
		"server %q is not a member of its cluster any more (the members are %v): it was removed; move its state directory away and join it again with a new server join token",
		name, names).WithDetail("servers", names)
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
// HTTP; false when the ALPN is not a server's.
func (s *Server) handoffPeer(tc *tls.Conn, proto string) bool {
	cl := s.cl
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
// role starts ready to take mutations.
func (s *Server) JoinCluster(ctx context.Context) error {
	cl := s.cl
	if cl.addDue {
		body := mustJSON(serverAddRequest{Name: cl.name, Address: s.advertise})
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
	for {
		changed := cl.node.Changed()
		// A server just added knows its leader from a heartbeat before the
		// configuration that names it has reached it: wait for both.
		if st := cl.node.Stats(); st.LeaderID != "" && (!cl.addDue || s.isMember(st.Servers)) {
			s.logger.Info("server cluster", "leader", st.LeaderID, "state", st.State, "term", st.Term)
			s.afterJoin()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			s.logger.Warn("no leader of the server cluster yet; mutations answer not_leader until one is elected")
			return nil
		case <-changed:
		}
	}
}

// isMember reports whether servers names this server.
func (s *Server) isMember(servers []raftlog.Server) bool {
	for _, m := range servers {
		if m.ID == s.cl.name {
			return true
		}
	}
	return false
}

// ServeManagement lets the leader answer the management requests its
// followers relay: h is the management API's handler, token its admin
// token (the relay's mutual TLS authenticated the follower, which
// authenticated the operator).
func (s *Server) ServeManagement(h http.Handler, adminToken string) {
	s.cl.mu.Lock()
	s.cl.mgmt, s.cl.adminToken = h, adminToken
	s.cl.mu.Unlock()
}

// notLeader is this server's refusal of a change only the leader makes.
func (s *Server) notLeader(st raftlog.Stats) *structs.Error {
	if st.LeaderID == "" {
		return structs.Errf(structs.CodeNotLeader, "server %s is not the leader and no leader is elected now; retry once one is", s.cl.name).
			WithDetail("leader_id", "").WithDetail("leader_address", "")
	}
	return structs.Errf(structs.CodeNotLeader, "server %s is not the leader; the leader is %s at %s", s.cl.name, st.LeaderID, st.LeaderAddress).
		WithDetail("leader_id", st.LeaderID).WithDetail("leader_address", st.LeaderAddress)
}

// leaderOnly returns not_leader on a follower, nil on the leader.
func (s *Server) leaderOnly() error {
	if st := s.cl.node.View(); st.State != "leader" {
		return s.notLeader(st)
	}
	return nil
}

// storeMeta reads a key of the store's meta bucket ("" when absent).
func storeMeta(st *store.Store, key string) string {
	v, _ := st.Meta(key)
	return v
}
