// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/raftlog"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

// expect is the number of voters the cluster intends: the first server's
// bootstrap_expect, from the replicated state (1 before it is written).
func (s *Server) expect() int {
	if c := s.State.Cluster(); c != nil && c.Expect > 0 {
		return c.Expect
	}
	return 1
}

// Servers lists the cluster's members, each one's figures asked of it
// (api.Servers).
func (s *Server) Servers(ctx context.Context) (wire.ServerList, error) {
	cl := s.cl
	own := cl.node.Stats()
	out := wire.ServerList{APIVersion: wire.APIVersion, Raft: true, Self: cl.name, Leader: own.LeaderID, Expect: s.expect()}
	infos := make([]wire.ServerInfo, len(own.Servers))
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
			var st raftlog.Stats
			if err := getJSON(cctx, cl.client, addr, "/status", &st); err != nil {
				infos[i].State, infos[i].Error = "unreachable", err.Error()
				return
			}
			fill(&infos[i], st)
		}(i, m.Address)
	}
	wg.Wait()
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

func fill(in *wire.ServerInfo, st raftlog.Stats) {
	in.State, in.Term, in.LastIndex, in.AppliedIndex, in.Leader = st.State, st.Term, st.LastIndex, st.AppliedIndex, st.LeaderID
}

// ClusterWarnings say what an operator should know of the cluster: fewer
// voters than the cluster intends, or no leader.
func (s *Server) ClusterWarnings() []string {
	st := s.cl.node.Stats()
	voters := 0
	for _, m := range st.Servers {
		if m.Voter {
			voters++
		}
	}
	var out []string
	if expect := s.expect(); voters < expect {
		out = append(out, fmt.Sprintf("the server cluster is degraded: %d of the %d servers bootstrap_expect names are voters (join the others: capyctl start server --join)", voters, expect))
	}
	if st.LeaderID == "" {
		out = append(out, "the server cluster has no leader now: mutations answer not_leader until one is elected")
	}
	return out
}

// RemoveServer takes a server out of the raft configuration (api.Servers;
// the leader's call, relayed there from a follower).
func (s *Server) RemoveServer(name string) error {
	found, voters := false, 0
	for _, m := range s.cl.node.Stats().Servers {
		found = found || m.ID == name
		if m.Voter {
			voters++
		}
	}
	if !found {
		return structs.Errf(structs.CodeNotFound, "no server %s in the cluster (capyctl list servers)", name)
	}
	if voters <= 1 {
		return structs.Errf(structs.CodeConflict, "server %s is the cluster's last voter: a cluster cannot remove its only server", name)
	}
	if name == s.cl.name {
		return s.removeSelf()
	}
	var addr string
	for _, m := range s.cl.node.Stats().Servers {
		if m.ID == name {
			addr = m.Address
		}
	}
	if err := s.cl.node.RemoveServer(name); err != nil {
		return err
	}
	// The removed server is told (the leader stops replicating to it, so
	// the configuration may never reach it), then refused by every server.
	ctx, cancel := context.WithTimeout(s.runCtx(), 5*time.Second)
	if err := postJSON(ctx, s.cl.client, addr, "/removed", nil, nil); err != nil {
		s.logger.Warn("tell the removed server", "server", name, "error", err)
	}
	cancel()
	if err := s.apply(fsm.ServerRemoved{Name: name}); err != nil {
		return err
	}
	s.event("server_removed", name, nil)
	return nil
}

// removeSelf removes the leader itself: it hands the leadership over,
// then asks the new leader to remove it.
func (s *Server) removeSelf() error {
	if err := s.cl.node.TransferLeadership(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.runCtx(), applyTimeout)
	defer cancel()
	for {
		changed := s.cl.node.Changed()
		if st := s.cl.node.Stats(); st.LeaderAddress != "" && st.LeaderID != s.cl.name {
			return postJSON(ctx, s.cl.client, st.LeaderAddress, "/remove-server", mustJSON(serverAddRequest{Name: s.cl.name}), nil)
		}
		select {
		case <-ctx.Done():
			return structs.Errf(structs.CodeNotLeader, "server %s handed its leadership over and no new leader is known yet: remove it again on another server", s.cl.name)
		case <-changed:
		}
	}
}

// NewServerJoinToken makes a one-time token that joins a server to the
// cluster (api.Servers).
func (s *Server) NewServerJoinToken(ttl time.Duration) (wire.JoinToken, error) {
	tok, err := s.auth.NewServerJoinToken(ttl)
	if err != nil {
		return wire.JoinToken{}, err
	}
	return wire.JoinToken{Token: tok, ExpiresAt: time.Now().UTC().Add(ttl), CAFingerprint: s.CAFingerprint(),
		ClusterAddress: s.advertise, Role: pki.TokenRoleServer}, nil
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
