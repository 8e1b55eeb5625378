// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"reflect"
	"time"
)

// A wait of the server on its hosts (a member's start admitted, a group's
// head ready, an adopted deployment's ledger verdict) reads what it waits
// for, then waits for the next change of a host concerned: a journal the
// host pushes at each record write of an instance (a transition, a last
// error, a charge, a ledger phase), or its link going up or down. Never
// on a timer: the change signals are taken before the read, so a change
// between the read and the wait is not missed.

// hostChanges are the change signals a wait waits on.
type hostChanges []reflect.SelectCase

// hostChanges takes the change signals of hosts (a host this server does
// not know has none) and of more.
func (s *Server) hostChanges(hosts []string, more ...<-chan struct{}) hostChanges {
	cs := make(hostChanges, 0, len(hosts)+len(more)+2)
	s.mu.Lock()
	for _, host := range hosts {
		if h := s.hosts[host]; h != nil {
			cs = append(cs, recvCase(h.changed.changed()))
		}
	}
	s.mu.Unlock()
	for _, ch := range more {
		cs = append(cs, recvCase(ch))
	}
	return cs
}

// wait waits until one of the changes fires (false, nil), the deadline
// passes (true, nil), or ctx ends (its error).
func (c hostChanges) wait(ctx context.Context, deadline <-chan time.Time) (expired bool, err error) {
	cases := append(c, recvCase(ctx.Done()), recvCase(deadline))
	switch i, _, _ := reflect.Select(cases); i {
	case len(c):
		return false, ctx.Err()
	case len(c) + 1:
		return true, nil
	}
	return false, nil
}

func recvCase[T any](ch <-chan T) reflect.SelectCase {
	return reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)}
}
