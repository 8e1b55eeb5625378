// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package serverapi

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// Server is everything the endpoints ask of the fleet server. The fleet
// server answers it (core/fleet's endpoints adapter); a test answers it
// with a fake, so a handler is tested without raft, links or hosts.
// IMPORTANT: the endpoints reach the server through this and nothing
// else (the import guard keeps core/fleet out of this package's links):
// what a handler needs and the server does not offer here is added here,
// named for what it does, not reached around.
type Server interface {
	Hosts
	State
	Deployments
	Engines
}

// Hosts reaches the hosts over their links.
type Hosts interface {
	// Reachable lists the hosts linked to this server now.
	Reachable() []string
	// InReach reports whether a host is linked to this server now.
	InReach(host string) bool
	// Call makes one management call on a host (the path below the
	// management prefix); the answer's status and body come back as they
	// are.
	Call(ctx context.Context, host, method, path string, hdr http.Header, body []byte) (int, []byte, error)
	// Metrics reads a host's /metrics text; ok is false when the host
	// did not answer it with 200.
	Metrics(ctx context.Context, host string) (text []byte, ok bool)
	// ServeMetrics answers the server's own /metrics series.
	ServeMetrics(w http.ResponseWriter, r *http.Request)
}

// State reads the replicated state and the server's own records.
type State interface {
	// Placement is a deployment's placement, if the cluster has one.
	Placement(name string) (*fsm.Placement, bool)
	// Placements lists every placement.
	Placements() []*fsm.Placement
	// HostKnown reports whether a host has joined the cluster.
	HostKnown(name string) bool
	// HostList lists the cluster's hosts as the API shows them.
	HostList() []wire.Host
	// EventCursor is the event journal's cursor now (a snapshot's).
	EventCursor() (string, error)
	// Once runs a mutation under the request's Idempotency-Key: an exact
	// retry replays the first answer (api.Receipts).
	Once(w http.ResponseWriter, r *http.Request, body []byte, do func() (int, any, error))
}

// Deployments are the server's moves on deployments: the endpoints
// decode, route and answer; the server decides and carries out.
type Deployments interface {
	// Status merges a placement's hosts' statuses into one.
	Status(ctx context.Context, p *fsm.Placement) wire.DeploymentStatus
	// Create places a new deployment (a group or placed instances); the
	// endpoint has checked that no deployment of its name exists.
	Create(ctx context.Context, spec *structs.Deployment, raw json.RawMessage, activate bool) (*wire.DeploymentStatus, error)
	// Update writes a placed deployment's new revision.
	Update(ctx context.Context, p *fsm.Placement, raw json.RawMessage, expected uint64, activate bool) (*wire.DeploymentStatus, error)
	// Action runs a deployment action on a placed deployment and answers
	// its status and body.
	Action(ctx context.Context, p *fsm.Placement, req wire.ActionRequest) (int, any, error)
	// InstanceAction runs an action on one instance of a placed
	// deployment: local is its index on host, idx the deployment-wide
	// one.
	InstanceAction(ctx context.Context, p *fsm.Placement, host string, local, idx int, req wire.ActionRequest) (int, any, error)
	// Delete deletes a placed deployment.
	Delete(ctx context.Context, p *fsm.Placement) error
	// DeleteGroup stops every rank of a group, then deletes its members.
	DeleteGroup(ctx context.Context, p *fsm.Placement) error
	// Unplace forgets an adopted deployment the hosts deleted.
	Unplace(name string) error
	// Replace records an adopted deployment's placement again (its new
	// revision).
	Replace(p *fsm.Placement) error
	// ForgetStatus drops what the hosts last said of a deleted
	// deployment.
	ForgetStatus(name string)
	// GroupChange answers a change of a group (PUT or an action): only
	// the server moves a group, all of its members at once.
	GroupChange(w http.ResponseWriter, r *http.Request, p *fsm.Placement, body []byte)
	// StartEvicting starts an adopted deployment's share on host with
	// evict, evicting groups in the way; handled is false when host runs
	// no group member (the start is then relayed as any other).
	StartEvicting(ctx context.Context, host, name string) (handled bool, err error)
}

// Engines are the server's moves on engine registrations.
type Engines interface {
	// RegisterEngine registers an engine as the cluster's (desired
	// state) and waits for the hosts linked now.
	RegisterEngine(ctx context.Context, req wire.EngineAddRequest, body []byte) (wire.EngineDetected, error)
	// RemoveEngine takes back a registration of the cluster; registered
	// is false when the cluster has none of that name (one made on the
	// hosts themselves).
	RemoveEngine(ctx context.Context, name string) (registered bool, err error)
}
