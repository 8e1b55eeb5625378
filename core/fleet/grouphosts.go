// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// memberHosts is what the server's group code (group*.go) and its host
// calls (hostCall) need from the hosts, and nothing more: a host's answer
// to its share of the desired state, a typed command on a host's link (a
// member's park or wake), a management call over a host's relay (a
// member's status), the signals a wait waits on, the
// journals a host pushed, and whether a host is in reach. The Server's own is
// linkedHosts, over the host links; a test gives a fake of it
// (ServerOptions has no knob for it: the test sets Server.hostIO before
// Start), so the order of a bring-up, a take-back and a failure's stop
// are tested without a host agent (issue #27 step 7).
type memberHosts interface {
	// call makes one management call (wire.Prefix+path) on a host,
	// bounded by d; the answer's status and body come back as they are,
	// a host out of reach as host_unreachable naming it.
	call(ctx context.Context, d time.Duration, host, method, path string, hdr http.Header, body []byte) (int, []byte, error)
	// changes takes the change signals of hosts (a journal pushed, a link
	// up or down; a host unknown has none) and of more, before the read a
	// wait then makes.
	changes(hosts []string, more ...<-chan struct{}) hostChanges
	// journaled is a signal closed at the next journal of any host (or a
	// link that comes up).
	journaled() <-chan struct{}
	// journal is the last journal of instance id a host pushed; nil when
	// its link is down or it sent none.
	journal(host, id string) *hostv1.InstanceJournal
	// reachable reports whether a host's link and relay are up.
	reachable(host string) bool
	// applied waits until a host answered its share of the desired state
	// read at index or later (in this leader's term) and returns the
	// answer; host_unreachable when its link is down or ctx ends first.
	applied(ctx context.Context, host string, index uint64) (*hostv1.DesiredApplied, error)
	// command runs a typed command (a member's park or wake) on a host
	// over its link, with the leader's term, once per command ID, and
	// waits for its result.
	command(ctx context.Context, host string, a *hostv1.DeploymentAction) error
}

// linkedHosts is the Server's memberHosts: its hosts' links.
type linkedHosts struct{ s *Server }

func (l linkedHosts) call(ctx context.Context, d time.Duration, host, method, path string, hdr http.Header, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	h := http.Header{}
	for _, k := range []string{"Content-Type", "Accept", "Idempotency-Key"} {
		if v := hdr.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	if k := h.Get(wire.HeaderIdempotencyKey); k != "" {
		h.Set(wire.HeaderIdempotencyKey, k+"@"+host) // one key per host: a retry replays each host's answer
	}
	resp, err := l.s.roundTrip(ctx, host, method, wire.Prefix+path, h, "", body)
	if err != nil {
		return 0, nil, structs.Wrap(structs.CodeHostUnreachable, err, "host %s", host).WithDetail("host", host)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, structs.Wrap(structs.CodeHostUnreachable, err, "read host %s's answer", host).WithDetail("host", host)
	}
	return resp.StatusCode, data, nil
}

func (l linkedHosts) changes(hosts []string, more ...<-chan struct{}) hostChanges {
	return l.s.hostChanges(hosts, more...)
}

func (l linkedHosts) journaled() <-chan struct{} { return l.s.journaled.changed() }

func (l linkedHosts) journal(host, id string) *hostv1.InstanceJournal {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	h := l.s.hosts[host]
	if h == nil || h.linkCancel == nil {
		return nil
	}
	return h.journals[id]
}

func (l linkedHosts) reachable(host string) bool {
	_, ok := l.s.readiness(host)
	return ok
}

func (l linkedHosts) applied(ctx context.Context, host string, index uint64) (*hostv1.DesiredApplied, error) {
	return l.s.waitApplied(ctx, host, index)
}

func (l linkedHosts) command(ctx context.Context, host string, a *hostv1.DeploymentAction) error {
	return l.s.command(ctx, host, a)
}
