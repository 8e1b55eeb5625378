// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// Commands are what the leader asks of a host that is not desired state:
// a park of a deployment, a start, stop or park of one instance. Each
// travels on the host's link with the leader's raft term and a command_id
// the host runs once (its Deduper); the leader waits for its
// CommandResult on the link, or for the link to go.

// command sends one action to a host and waits for its result.
func (s *Server) command(ctx context.Context, host string, a *hostv1.DeploymentAction) error {
	if err := s.leaderOnly(); err != nil {
		return err
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	cmd := &hostv1.Command{CommandId: hex.EncodeToString(b[:]), Term: s.cl.node.Term(), Action: &hostv1.Command_Deployment{Deployment: a}}
	s.mu.Lock()
	h := s.hosts[host]
	if h == nil || h.linkCancel == nil {
		s.mu.Unlock()
		return structs.Errf(structs.CodeHostUnreachable, "host %s is not connected", host).WithDetail("host", host)
	}
	result := make(chan *hostv1.CommandResult, 1)
	if h.pending == nil {
		h.pending = map[string]chan *hostv1.CommandResult{}
	}
	h.pending[cmd.GetCommandId()] = result
	gen, out := h.linkGen, h.outbox
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(h.pending, cmd.GetCommandId())
		s.mu.Unlock()
	}()
	select {
	case out <- &hostv1.ServerMessage{Body: &hostv1.ServerMessage_Command{Command: cmd}}:
	case <-ctx.Done():
		return structs.Errf(structs.CodeHostUnreachable, "host %s did not take the command in time", host).WithDetail("host", host)
	}
	for {
		// The signal first, then the link's state: a link that goes
		// between the two is seen at the next turn.
		ch := h.changed.changed()
		s.mu.Lock()
		gone := h.linkGen != gen || h.linkCancel == nil
		s.mu.Unlock()
		select {
		case r := <-result:
			if r.GetOk() {
				return nil
			}
			return structs.Errf(structs.Code(r.GetCode()), "host %s: %s", host, r.GetMessage()).WithDetail("host", host)
		default:
		}
		if gone {
			return structs.Errf(structs.CodeHostUnreachable, "host %s's link went down before it answered", host).WithDetail("host", host)
		}
		select {
		case r := <-result:
			if r.GetOk() {
				return nil
			}
			return structs.Errf(structs.Code(r.GetCode()), "host %s: %s", host, r.GetMessage()).WithDetail("host", host)
		case <-ctx.Done():
			return structs.Errf(structs.CodeHostUnreachable, "host %s did not answer the command in time", host).WithDetail("host", host)
		case <-ch:
		}
	}
}

// commandResult hands a host's CommandResult to the command waiting for
// it; the caller holds mu.
func (h *liveHost) commandResult(r *hostv1.CommandResult) {
	if ch, ok := h.pending[r.GetCommandId()]; ok {
		select {
		case ch <- r:
		default:
		}
	}
}
