// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// Connect serves one host's link (hostv1.HostLinkServer): the host's
// Hello checked, its link registered (the newer link of a host wins),
// Welcome, then serveLink until the link breaks.
func (s *Server) Connect(stream hostv1.HostLink_ConnectServer) error {
	name, hello, refusal := s.checkHello(stream)
	if refusal != nil {
		_ = stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Welcome{Welcome: &hostv1.Welcome{
			Code: string(refusal.Code), Message: refusal.Message, ServerTimeUnixMs: time.Now().UnixMilli(), Protocol: 1,
			Term: s.cl.node.Term()}}})
		return nil
	}
	if hello == nil {
		return nil // the stream broke before its Hello
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	gen, ok := s.linkUp(stream.Context(), name, hello, cancel)
	if !ok {
		return nil
	}
	defer s.linkDown(name, gen)
	s.adoptLater(name)
	members := s.clusterServers()
	if err := stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Welcome{Welcome: &hostv1.Welcome{
		Accepted: true, ServerTimeUnixMs: time.Now().UnixMilli(), HeartbeatIntervalMs: s.o.Heartbeat.Milliseconds(), Protocol: 1,
		Cluster: members, Term: s.cl.node.Term()}}}); err != nil {
		return err
	}
	return s.serveLink(ctx, stream, name, gen, members)
}

// checkHello reads a link's Hello and checks it: the name its certificate
// carries, the protocol, a member of the cluster. A refusal is answered
// with a Welcome that says why; a broken stream returns neither.
func (s *Server) checkHello(stream hostv1.HostLink_ConnectServer) (string, *hostv1.Hello, *structs.Error) {
	name, err := peerHostName(stream.Context())
	if err != nil {
		return "", nil, structs.AsError(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return name, nil, nil
	}
	hello := first.GetHello()
	switch {
	case hello == nil:
		return name, nil, structs.Errf(structs.CodeInvalidRequest, "the first message on a host link is Hello")
	case hello.GetProtocol() != 1:
		return name, nil, structs.Errf(structs.CodeInvalidRequest, "this server speaks host link protocol 1, the host %d", hello.GetProtocol())
	case hello.GetHostName() != name:
		s.logger.Warn("host name changed", "certificate", name, "hello", hello.GetHostName())
		return name, nil, structs.Errf(structs.CodeHostNameChanged, "this host's certificate names %q and it now calls itself %q; run it with its old name, or remove the host and join again",
			name, hello.GetHostName())
	}
	if _, known := s.State.Host(name); !known {
		return name, nil, s.hostRefusal(name)
	}
	if err := s.checkHelloBounds(hello); err != nil {
		s.refuseHost(s.guardOf(name), name, refusedInvalid)
		return name, nil, structs.Errf(structs.CodeInvalidRequest, "host %s's Hello: %v", name, err)
	}
	return name, hello, nil
}

// checkHelloBounds checks what a Hello brings: its inventory and its
// instances (linkbounds.go).
func (s *Server) checkHelloBounds(hello *hostv1.Hello) error {
	l := s.limits
	if len(hello.GetInstances()) > l.instances {
		return fmt.Errorf("%d instances, over the %d a host may hold", len(hello.GetInstances()), l.instances)
	}
	if err := l.checkText("version", hello.GetVersion(), 256); err != nil {
		return err
	}
	if err := l.checkInventory(hello.GetInventory()); err != nil {
		return err
	}
	for _, j := range hello.GetInstances() {
		l.clipJournal(j)
		if err := l.checkJournal(j); err != nil {
			return err
		}
	}
	return nil
}

// linkUp registers a host's new link (ending an older one) with what its
// Hello says, and returns the link's generation; false when the host was
// removed meanwhile.
func (s *Server) linkUp(ctx context.Context, name string, hello *hostv1.Hello, cancel context.CancelFunc) (uint64, bool) {
	var expiry time.Time
	if cert := peerCert(ctx); cert != nil {
		expiry = cert.NotAfter
	}
	s.mu.Lock()
	if _, member := s.State.Host(name); !member { // removed meanwhile
		s.mu.Unlock()
		return 0, false
	}
	h := s.hostLocked(name)
	if h.linkCancel != nil {
		h.linkCancel() // one link per host: the newer one wins
	}
	h.linkGen++
	gen := h.linkGen
	h.sentIndex, h.sameThrough = 0, 0 // this link has sent nothing yet
	wasLost := !h.lastSeen.IsZero()
	h.linkCancel, h.addr, h.version, h.inventory = cancel, peerAddr(ctx), hello.GetVersion(), hello.GetInventory()
	h.lastSeen, h.certExpiry = time.Now(), expiry
	h.setJournals(hello.GetInstances())
	h.outbox = make(chan *hostv1.ServerMessage, 16)
	addr := h.addr
	h.downSince = time.Time{}
	s.mu.Unlock()
	h.changed.publish()
	s.links.publish()
	s.journaled.publish()
	if wasLost {
		s.event("host_reconnected", name, map[string]any{"instances": len(hello.GetInstances())})
	}
	s.logger.Info("host link up", "host", name, "address", addr, "instances", len(hello.GetInstances()))
	return gen, true
}

// serveLink runs an accepted link until it breaks: each host message is
// applied and acknowledged; the cluster's servers are told again when the
// configuration changes; and, on the leader, the host's share of the
// desired state is sent whenever it changed (a new term counts: the host
// learns it, and fences the deposed leader).
func (s *Server) serveLink(ctx context.Context, stream hostv1.HostLink_ConnectServer, name string, gen uint64, members *hostv1.ClusterServers) error {
	guard := s.guardOf(name)
	msgs, errc := recvLoop(ctx, stream, func() { s.refuseHost(guard, name, refusedTooLarge) })
	s.mu.Lock()
	outbox := s.hosts[name].outbox
	s.mu.Unlock()
	var sent [32]byte // the digest of the last share sent on this link
	recheck := true
	// Each signal is taken anew only once it fired, and before the state
	// is read again: a change while a host message is handled is never
	// missed.
	stateChanged, raftChanged, leadChanged := s.State.Changed(), s.cl.node.Changed(), s.leading.changed()
	for {
		if recheck {
			recheck = false
			s.rememberPlaced(name, guard)
			if d := s.desiredFor(name); d != nil {
				dg := desiredDigest(d)
				fresh := dg != sent
				if fresh {
					if err := stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Desired{Desired: d}}); err != nil {
						return err
					}
					sent = dg
				}
				s.noteShare(name, gen, d.GetIndex(), fresh)
			}
			if now := s.clusterServers(); !sameServers(now, members) {
				members = now
				if err := stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Servers{Servers: now}}); err != nil {
					return err
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-stateChanged:
			stateChanged, recheck = s.State.Changed(), true
		case <-raftChanged:
			raftChanged, recheck = s.cl.node.Changed(), true
		case <-leadChanged:
			leadChanged, recheck = s.leading.changed(), true
		case m := <-outbox:
			if err := stream.Send(m); err != nil {
				return err
			}
		case m := <-msgs:
			if !guard.admit(proto.Size(m), time.Now()) {
				s.refuseHost(guard, name, refusedOverRate)
				s.logger.Warn("a host sent more than a host may: its link is closed", "host", name)
				err := errHostLinkFlooded(name, s.limits)
				return status.Error(codes.ResourceExhausted, string(structs.CodeHostLinkFlooded)+": "+err.Error())
			}
			s.onHostMessage(name, gen, guard, m)
			if err := stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Ack{Ack: &hostv1.Ack{Seq: m.GetSeq()}}}); err != nil {
				return err
			}
		}
	}
}

// noteShare records, for waitApplied, the index of a host's share sent
// on link gen (fresh) or found the same as the last one sent (not sent
// again: a change undone before the link read it, a change to other hosts'
// shares). A wait for a write's index then ends on the host's answer to
// the share that already says what the write says; without it, a wait
// for a share never sent waited out its whole bound.
func (s *Server) noteShare(host string, gen, index uint64, fresh bool) {
	s.mu.Lock()
	h := s.hosts[host]
	if h == nil || h.linkGen != gen {
		s.mu.Unlock()
		return
	}
	advanced := index > h.sameThrough
	if fresh {
		h.sentIndex = index
	}
	h.sameThrough = max(h.sameThrough, index)
	s.mu.Unlock()
	if advanced && !fresh {
		h.changed.publish()
	}
}

// recvLoop reads a link's messages on a goroutine of its own until the
// stream breaks (its error on errc) or ctx ends; tooLarge is called when
// it broke on a message over the size bound (gRPC's MaxRecvMsgSize).
func recvLoop(ctx context.Context, stream hostv1.HostLink_ConnectServer, tooLarge func()) (<-chan *hostv1.HostMessage, <-chan error) {
	msgs := make(chan *hostv1.HostMessage)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				if status.Code(err) == codes.ResourceExhausted {
					tooLarge()
				}
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
	return msgs, errc
}

// clusterServers is the raft configuration as hosts see it: this
// server's name and every member's cluster address.
func (s *Server) clusterServers() *hostv1.ClusterServers {
	st := s.cl.node.View()
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

// onHostMessage applies one message of a host's link, once checked
// against the host's bounds (linkbounds.go): a message over one is
// dropped and counted; a host's events are journalled in the order it
// sent them.
func (s *Server) onHostMessage(name string, gen uint64, g *hostGuard, m *hostv1.HostMessage) {
	if ev := m.GetEvent(); ev != nil && !hostLocalKind(ev.GetKind()) {
		s.limits.clipEvent(ev)
		if reason := s.checkHostEvent(name, g, ev); reason != "" {
			s.refuseHost(g, name, reason)
		} else {
			payload := map[string]any{"instance": ev.GetInstanceId(), "message": ev.GetMessage(), "host_time_unix_ms": ev.GetTimeUnixMs()}
			for k, v := range ev.GetAttributes() {
				if _, taken := payload[k]; !taken {
					payload[k] = v
				}
			}
			s.event(ev.GetKind(), name, payload)
		}
	}
	if reason := s.checkHostMessage(m); reason != "" {
		s.refuseHost(g, name, reason)
		return
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
		inv := h.inventory
		if next := b.Heartbeat.GetInventory(); next != nil {
			if err := s.limits.checkInventory(next); err != nil {
				s.refuseHost(g, name, refusedInventory)
				return
			}
			inv = next
		}
		if err := s.limits.checkReadings(b.Heartbeat.GetReadings(), inv); err != nil {
			s.refuseHost(g, name, refusedReadings)
			return
		}
		h.inventory, h.readings = inv, b.Heartbeat.GetReadings()
	case *hostv1.HostMessage_Result:
		h.commandResult(b.Result)
		if b.Result.GetCode() == string(structs.CodeStaleTerm) {
			s.logger.Warn("the host refused this server's command: a newer leader's term reached it first", "host", name, "message", b.Result.GetMessage())
			s.event("host_refused_stale_term", name, map[string]any{"command": b.Result.GetCommandId(), "message": b.Result.GetMessage()})
		}
	case *hostv1.HostMessage_Applied:
		h.applied = b.Applied
		defer h.changed.publish()
		if b.Applied.GetCode() == string(structs.CodeStaleTerm) {
			s.logger.Warn("the host refused this server's desired state: a newer leader's term reached it first", "host", name,
				"term", b.Applied.GetTerm(), "message", b.Applied.GetMessage())
			s.event("host_refused_stale_term", name, map[string]any{"term": b.Applied.GetTerm(), "message": b.Applied.GetMessage()})
		}
	case *hostv1.HostMessage_Journal:
		j := b.Journal
		if j.GetState() == string(structs.StateStopped) && j.GetDeployment() == "" {
			h.dropJournal(j.GetInstanceId())
		} else {
			if _, had := h.journals[j.GetInstanceId()]; !had && len(h.journals) >= s.limits.instances {
				s.refuseHost(g, name, refusedInstances)
				return
			}
			g.remember(time.Now(), j.GetDeployment())
			h.putJournal(j)
			if _, placed := s.State.Placement(j.GetDeployment()); !placed && !j.GetPlaced() {
				s.adoptLaterLocked(s.leaderCtx, h) // a deployment made on the host itself
			}
		}
		defer s.journaled.publish()
		defer h.changed.publish()
	}
}

// checkHostMessage checks the shape of a message other than an event
// (those are checkHostEvent's) and returns why it is refused, "" when not.
func (s *Server) checkHostMessage(m *hostv1.HostMessage) string {
	l := s.limits
	var err error
	switch b := m.GetBody().(type) {
	case *hostv1.HostMessage_Journal:
		l.clipJournal(b.Journal)
		err = l.checkJournal(b.Journal)
	case *hostv1.HostMessage_Result:
		err = errors.Join(l.checkText("command id", b.Result.GetCommandId(), 128), l.checkText("code", b.Result.GetCode(), 64),
			l.checkText("message", b.Result.GetMessage(), l.text))
	case *hostv1.HostMessage_Applied:
		a := b.Applied
		err = errors.Join(l.checkText("code", a.GetCode(), 64), l.checkText("message", a.GetMessage(), l.text))
		if len(a.GetResults()) > 4*l.knownMax {
			err = fmt.Errorf("%d results", len(a.GetResults()))
		}
		for _, r := range a.GetResults() {
			if err != nil {
				break
			}
			err = errors.Join(l.checkText("kind", r.GetKind(), 64), l.checkText("name", r.GetName(), 128), l.checkText("code", r.GetCode(), 64),
				l.checkText("message", r.GetMessage(), l.text), l.checkText("head address", r.GetHeadAddress(), 256))
		}
	}
	if err != nil {
		return refusedInvalid
	}
	return ""
}

// checkHostEvent checks a host's event (M2 of the trust review): its
// shape and size, the events' rate, a kind a host's own lifecycle writes,
// and a deployment that is the host's: one it holds, ran lately or was
// placed, or one the cluster places nowhere (a deployment made on the
// host itself). It returns why the event is refused, "" when it is not.
func (s *Server) checkHostEvent(host string, g *hostGuard, ev *hostv1.Event) string {
	dep, err := s.limits.checkEvent(ev)
	if err != nil {
		return refusedInvalid
	}
	if !g.admitEvent(proto.Size(ev), time.Now()) {
		return refusedEventsRate
	}
	if !hostEventKind(ev.GetKind()) {
		return refusedEventKind
	}
	if dep == "" {
		if ev.GetKind() == "engine_added" || ev.GetKind() == "engine_removed" {
			return ""
		}
		return refusedEventNotOwn // every other kind is about a deployment
	}
	if !s.hostOwns(host, g, dep) {
		return refusedEventNotOwn
	}
	return ""
}

// hostOwns reports whether dep is host's to speak of: it holds an
// instance of it, ran or was placed it lately, or no placement names it
// (a deployment made on the host itself, not adopted yet).
func (s *Server) hostOwns(host string, g *hostGuard, dep string) bool {
	if g.knows(dep, time.Now()) {
		return true
	}
	p, placed := s.State.Placement(dep)
	if !placed {
		return true
	}
	return slices.Contains(p.HostNames(), host)
}

// rememberPlaced marks the deployments placed on host as its own: its
// events about one deleted meanwhile are still taken for a while.
func (s *Server) rememberPlaced(host string, g *hostGuard) {
	var deps []string
	for _, p := range s.State.PlacementsOn(host) {
		deps = append(deps, p.Deployment)
	}
	g.remember(time.Now(), deps...)
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
	h.downSince = time.Now()
	relay := h.relayConn
	h.relay, h.relayConn, h.relayHeard = nil, nil, nil
	s.mu.Unlock()
	h.changed.publish() // a wait on the host ends: it is out of reach
	s.links.publish()
	if relay != nil {
		relay.Close()
	}
	if s.ctx.Err() == nil {
		s.logger.Warn("host link down: its instances are uncertain until it comes back", "host", name)
		s.event("host_lost", name, nil)
	}
}

// watchLost ends the link of a host silent for lostAfterBeats heartbeat
// intervals (a partition may leave the TCP connection open): no message on
// its link and nothing on its relay for that long.
//
// IMPORTANT: the relay counts. Under a burst (10,000 streams opening on a
// loaded machine) a host's heartbeat waits its turn behind the goroutines
// relaying its streams, and reached the server more than three intervals
// apart while the relay delivered the host's chunks; the server then took
// the host for lost and closed its relay, cutting every stream on it (200
// then a host_unreachable event) and refusing the next ones 503 until the
// host linked again. The relay keeps a host for linkWedgedBeats intervals
// at most: a link that long silent is wedged, and commands sent on it
// would go nowhere without a word.
func (s *Server) watchLost() {
	t := time.NewTicker(s.o.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		limit := now.Add(-lostAfterBeats * s.o.Heartbeat)
		wedged := now.Add(-linkWedgedBeats * s.o.Heartbeat)
		s.mu.Lock()
		for _, h := range s.hosts {
			if h.linkCancel != nil && h.lastSeen.Before(limit) &&
				(!h.relayHeard.since(limit) || h.lastSeen.Before(wedged)) {
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
