// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"
	"time"
)

// HostRecord is the cluster's record of a joined host.
type HostRecord struct {
	Name     string    `json:"name"`
	JoinedAt time.Time `json:"joined_at"`
	Drained  bool      `json:"drained,omitempty"`
}

// Placement says which hosts run a deployment and how many instances
// each: the leader's decision, kept so that the hosts' engines are found
// again after a restart, never started twice.
type Placement struct {
	Deployment string `json:"deployment"`
	// Hosts are the hosts in instance order: the deployment's instance
	// indexes run through them (host 0's instances first).
	Hosts []HostShare `json:"hosts"`
	// Routes are the model names the deployment answers.
	Routes []string `json:"routes"`
	// Endpoints are the inference endpoints its engine serves.
	Endpoints []string `json:"endpoints,omitempty"`
	// Revision is the revision the hosts run.
	Revision uint64    `json:"revision"`
	At       time.Time `json:"at"`
	// Group is set for one model across several machines: one member per
	// host of Hosts, in rank order.
	Group *GroupPlacement `json:"group,omitempty"`

	// The desired state each host reconciles (empty Spec: a deployment
	// the host made itself and the cluster adopted, which the host runs
	// as it wants, or a group, whose members the leader moves itself).
	// Spec is the deployment's job spec (JSON form) as the operator wrote
	// it; each host runs its share of its instances.
	Spec json.RawMessage `json:"spec,omitempty"`
	// Desired is the deployment's desired state: running, on_demand or
	// stopped.
	Desired string `json:"desired,omitempty"`
	// Evict lets the start Desired asks for park or stop idle models on a
	// host that has no room (an operator's start --evict).
	Evict bool `json:"evict,omitempty"`
	// Starts counts the operators' starts: each one has the hosts start
	// the deployment again (its stopped or failed instances).
	Starts uint64 `json:"starts,omitempty"`
	// Pending marks a placement being made: its name and routes are
	// reserved and its hosts are trying it; it routes no request yet. A
	// group's is written pending until its members are up; a deployment's
	// is placed at once (its hosts' journals say when it routes).
	Pending bool `json:"pending,omitempty"`
	// Version counts the placement's changes (1 for the first): a change
	// names the version it replaces (Placed.Expect).
	Version uint64 `json:"version,omitempty"`
}

// Managed reports whether the hosts run the placement from the desired
// state (not adopted, not a group).
func (p *Placement) Managed() bool { return len(p.Spec) > 0 && p.Group == nil }

// Reconciled reports whether a group's members are run by their hosts
// from the desired state (its spec and each rank's desired state).
func (p *Placement) Reconciled() bool {
	return len(p.Spec) > 0 && p.Group != nil && len(p.Group.Ranks) == len(p.Group.Hosts)
}

// HostShare is one host's part of a placement.
type HostShare struct {
	Host      string `json:"host"`
	Instances int    `json:"instances"`
}

// GroupPlacement is a group's part of its placement.
type GroupPlacement struct {
	// ID names this placement of the group (its members carry it).
	ID string `json:"id"`
	// Hosts are the members' hosts in rank order: Hosts[0] runs the head.
	Hosts []string `json:"hosts"`
	// HeadAddress and RendezvousPort are where the ranks meet: the head
	// host's peer address and the port its host picked.
	HeadAddress      string `json:"head_address,omitempty"`
	RendezvousPort   int    `json:"rendezvous_port,omitempty"`
	TensorParallel   int    `json:"tensor_parallel"`
	PipelineParallel int    `json:"pipeline_parallel"`
	// Ranks are each member's desired state, in rank order (one per
	// host of Hosts): what each host reconciles its member with, from
	// the placement's Spec. A worker's share is sent once the head's
	// rendezvous address is known (HeadAddress set).
	Ranks []RankDesired `json:"ranks,omitempty"`
}

// RankDesired is one group member's desired state.
type RankDesired struct {
	// Desired is "running", "on_demand" (made, not started) or
	// "stopped".
	Desired string `json:"desired"`
	// Starts counts the server's starts of the member: when it grows, its
	// host starts the member again (a stopped or failed one).
	Starts uint64 `json:"starts,omitempty"`
	// Evict lets the member's start make room on its host.
	Evict bool `json:"evict,omitempty"`
}

// HostNames lists the placement's hosts.
func (p *Placement) HostNames() []string {
	out := make([]string, 0, len(p.Hosts))
	for _, h := range p.Hosts {
		out = append(out, h.Host)
	}
	return out
}

// clone is a deep copy: callers get their own.
func (p *Placement) clone() *Placement {
	cp := *p
	cp.Hosts = append([]HostShare(nil), p.Hosts...)
	cp.Routes = append([]string(nil), p.Routes...)
	cp.Endpoints = append([]string(nil), p.Endpoints...)
	cp.Spec = append(json.RawMessage(nil), p.Spec...)
	if p.Group != nil {
		g := *p.Group
		g.Hosts = append([]string(nil), p.Group.Hosts...)
		g.Ranks = append([]RankDesired(nil), p.Group.Ranks...)
		cp.Group = &g
	}
	return &cp
}

// ClusterRecord is the cluster's own settings, from its first server.
type ClusterRecord struct {
	// Expect is the number of voters the operator intends
	// (bootstrap_expect of the first server).
	Expect int `json:"expect"`
}
