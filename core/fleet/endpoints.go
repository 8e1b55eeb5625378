// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/linkwire"
	"github.com/capyctl/capyctl/core/fleet/serverapi"
	"github.com/capyctl/capyctl/core/structs"
)

// The management endpoints are core/fleet/serverapi's: this file is the
// server's side of their interface (serverapi.Server), the one way they
// reach it.

// stateUncertain is an instance's state while its host is out of reach:
// the server does not know it, and keeps its charges.
const stateUncertain = "uncertain"

// maxMgmtBody bounds a management body the server reads or relays.
const maxMgmtBody = serverapi.MaxBody

// fanOutTimeout bounds a read asked of every host (the engines, the
// views, the metrics, the models): a host that does not answer in time is
// left out of the answer.
const fanOutTimeout = serverapi.FanOutTimeout

// hostCallTimeout bounds one management call to a host (a deploy waits
// for the engine's activation on the host: the host's own bound is 2 min).
const hostCallTimeout = 150 * time.Second

// hostError turns a host's error answer back into a catalogue error.
var hostError = linkwire.HostError

// writeJSON, writeError and readMgmtBody are the management API's own.
var (
	writeJSON    = api.WriteJSON
	writeError   = api.WriteManagementError
	readMgmtBody = serverapi.ReadBody
)

// ManagementOverrides are the server's answers to the management routes
// that need a lifecycle: each is answered from the hosts, over their
// relays (api.Backend.Override; core/fleet/serverapi).
func (s *Server) ManagementOverrides(role func() wire.RoleInfo) map[string]http.HandlerFunc {
	return serverapi.Routes(endpoints{s}, role)
}

// hostCall makes one management call on a host; the answer's status and
// body come back as they are.
func (s *Server) hostCall(ctx context.Context, host, method, path string, hdr http.Header, body []byte) (int, []byte, error) {
	return s.hostCallWithin(ctx, hostCallTimeout, host, method, path, hdr, body)
}

// hostCallWithin is hostCall bounded by d (a group member's park or wake
// waits for the engine).
func (s *Server) hostCallWithin(ctx context.Context, d time.Duration, host, method, path string, hdr http.Header, body []byte) (int, []byte, error) {
	return s.hostIO.call(ctx, d, host, method, path, hdr, body)
}

// forgetStatus drops what the hosts last said of a deleted deployment.
func (s *Server) forgetStatus(name string) {
	s.lastStatus.mu.Lock()
	defer s.lastStatus.mu.Unlock()
	for k := range s.lastStatus.m {
		if strings.HasPrefix(k, name+"\x00") {
			delete(s.lastStatus.m, k)
		}
	}
}

// endpoints is the server as the management endpoints see it
// (serverapi.Server).
type endpoints struct{ s *Server }

var _ serverapi.Server = endpoints{}

func (e endpoints) Reachable() []string { return e.s.reachable() }

func (e endpoints) InReach(host string) bool {
	_, ok := e.s.relayOf(host)
	return ok
}

func (e endpoints) Call(ctx context.Context, host, method, path string, hdr http.Header, body []byte) (int, []byte, error) {
	return e.s.hostCall(ctx, host, method, path, hdr, body)
}

func (e endpoints) Metrics(ctx context.Context, host string) ([]byte, bool) {
	resp, err := e.s.roundTrip(ctx, host, http.MethodGet, "/metrics", nil, "", nil)
	if err != nil {
		return nil, false
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	resp.Body.Close()
	return data, resp.StatusCode == http.StatusOK
}

func (e endpoints) ServeMetrics(w http.ResponseWriter, r *http.Request) { e.s.metrics.ServeHTTP(w, r) }

func (e endpoints) Placement(name string) (*fsm.Placement, bool) { return e.s.State.Placement(name) }

func (e endpoints) Placements() []*fsm.Placement { return e.s.State.Placements() }

func (e endpoints) HostKnown(name string) bool {
	_, ok := e.s.State.Host(name)
	return ok
}

func (e endpoints) HostList() []wire.Host { return e.s.Hosts() }

func (e endpoints) EventCursor() (string, error) {
	seq, err := e.s.o.Store.LatestEventSeq()
	if err != nil {
		return "", err
	}
	return e.s.o.Store.Cursor(seq), nil
}

func (e endpoints) Once(w http.ResponseWriter, r *http.Request, body []byte, do func() (int, any, error)) {
	e.s.receipts.Run(w, r, body, do)
}

func (e endpoints) Status(ctx context.Context, p *fsm.Placement) wire.DeploymentStatus {
	return e.s.deploymentStatus(ctx, p)
}

func (e endpoints) Create(ctx context.Context, spec *structs.Deployment, raw json.RawMessage, activate bool) (*wire.DeploymentStatus, error) {
	if err := e.s.State.RoutesFree(spec.Name, spec.Routes); err != nil {
		return nil, err
	}
	if spec.IsGroup() {
		return e.s.createGroup(ctx, spec, raw, activate)
	}
	return e.s.createPlaced(ctx, spec, raw, activate)
}

func (e endpoints) Update(ctx context.Context, p *fsm.Placement, raw json.RawMessage, expected uint64, activate bool) (*wire.DeploymentStatus, error) {
	return e.s.updatePlaced(ctx, p, raw, expected, activate)
}

func (e endpoints) Action(ctx context.Context, p *fsm.Placement, req wire.ActionRequest) (int, any, error) {
	return e.s.placedAction(ctx, p, req)
}

func (e endpoints) InstanceAction(ctx context.Context, p *fsm.Placement, host string, local, idx int, req wire.ActionRequest) (int, any, error) {
	return e.s.instanceAction(ctx, p, host, local, idx, req)
}

func (e endpoints) Delete(ctx context.Context, p *fsm.Placement) error {
	return e.s.deletePlaced(ctx, p)
}

func (e endpoints) DeleteGroup(ctx context.Context, p *fsm.Placement) error {
	return e.s.deleteGroup(ctx, p)
}

func (e endpoints) Unplace(name string) error { return e.s.apply(fsm.Unplaced{Deployment: name}) }

func (e endpoints) Replace(p *fsm.Placement) error { return e.s.apply(fsm.Placed{Placement: p}) }

func (e endpoints) ForgetStatus(name string) { e.s.forgetStatus(name) }

// GroupChange answers a change of a group: a new revision (PUT,
// grouprevision.go) or an action, each moving all of its members.
func (e endpoints) GroupChange(w http.ResponseWriter, r *http.Request, p *fsm.Placement, body []byte) {
	if r.Method == http.MethodPut {
		e.s.groupRevision(w, r, p, body)
		return
	}
	e.s.groupAction(w, r, p, body)
}

// StartEvicting waits for the host's verdict on the start at the server:
// refused for a group in the way, it parks that group and tries again.
func (e endpoints) StartEvicting(ctx context.Context, host, name string) (bool, error) {
	if !e.s.hostRunsGroup(host) {
		return false, nil
	}
	err := e.s.callWait(ctx, host, name, wire.ActionStart, true)
	if err != nil && e.s.evictGroups(ctx, name, err) {
		err = e.s.callWait(ctx, host, name, wire.ActionStart, true)
	}
	return true, err
}

func (e endpoints) RegisterEngine(ctx context.Context, req wire.EngineAddRequest, body []byte) (wire.EngineDetected, error) {
	return e.s.registerEngine(ctx, req, body)
}

func (e endpoints) RemoveEngine(ctx context.Context, name string) (bool, error) {
	return e.s.removeEngine(ctx, name)
}
