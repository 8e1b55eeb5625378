// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"context"
	"sync"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

// Handle is what a driver keeps per instance: the shared Instance itself,
// or a type of the driver's that embeds it beside what only its engine
// needs.
type Handle interface {
	// Base is the shared Instance.
	Base() *Instance
}

// Registry is the driver's instances by ID, and the calls that need
// nothing of an engine but its handle: Stop, Recover, Logs and the idle
// signal.
type Registry[H Handle] struct {
	mu sync.Mutex
	m  map[string]H
}

// NewRegistry returns an empty registry.
func NewRegistry[H Handle]() *Registry[H] { return &Registry[H]{m: map[string]H{}} }

// Get returns an instance or instance_not_found.
func (r *Registry[H]) Get(id string) (H, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.m[id]
	if !ok {
		return h, sdk.Errorf(sdk.CodeInstanceNotFound, "no instance %s on this driver", id)
	}
	return h, nil
}

// Put records an instance, replacing one with the same ID.
func (r *Registry[H]) Put(h H) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[h.Base().ID] = h
}

// Drop forgets an instance.
func (r *Registry[H]) Drop(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, id)
}

// Started records a launched instance and answers its Start.
func (r *Registry[H]) Started(h H) *sdk.StartResponse {
	r.Put(h)
	in := h.Base()
	return &sdk.StartResponse{Launch: *in.LaunchRecord(), Endpoint: *in.Endpoint, LMCacheServer: in.LMCacheServer}
}

// StopHooks adapt Stop to an engine that leaves more than processes
// behind (SGLang's shared memory and configuration file).
type StopHooks struct {
	// Before runs before the group is signalled.
	Before func(proc.Launched)
	// Gone runs once the group is proven gone, before the handle is
	// dropped; it may complete the answer (Cleaned).
	Gone func(proc.Launched, *sdk.StopResponse)
}

// Stop answers a Stop: the launch of the handle this driver keeps (with its
// grace period), else the recorded launch (with grace), else
// instance_not_found; the request's grace wins over both. The whole group
// ends; once it is proven gone the handle is dropped.
func (r *Registry[H]) Stop(req *sdk.StopRequest, grace time.Duration, hooks StopHooks) (*sdk.StopResponse, error) {
	h, err := r.Get(req.InstanceID)
	server := req.LMCacheServer
	var launched proc.Launched
	switch {
	case err == nil:
		launched, grace = h.Base().Launched, h.Base().StopGrace
	case req.Launch != nil:
		launched = FromLaunch(req.Launch)
	case server != nil:
		// Only the server is left (an instance parked with its engine
		// stopped).
		return StopLMCacheServer(server), nil
	default:
		return nil, err
	}
	if req.Grace > 0 {
		grace = req.Grace
	}
	if hooks.Before != nil {
		hooks.Before(launched)
	}
	resp := StopLaunch(launched, grace)
	if resp.Gone {
		if hooks.Gone != nil {
			hooks.Gone(launched, resp)
		}
		if err == nil {
			h.Base().Client.CloseIdleConnections()
		}
		r.Drop(req.InstanceID)
		// The server ends after its engine, which may write to it as it
		// stops.
		if server != nil {
			if sr := StopLMCacheServer(server); !sr.Gone {
				resp.Gone = false
				resp.Detail = "the engine is gone, its LMCache server is not: " + sr.Detail
			}
		}
	}
	return resp, nil
}

// AttachFunc builds the handle of a recorded launch whose engine runs, from
// what RecoverLaunch found; it returns the answer's detail (the one given,
// or more), or an error that makes the answer UNCERTAIN with the error as
// its detail (the engine runs, but the driver cannot tell its state).
type AttachFunc[H Handle] func(launched proc.Launched, detail string) (H, string, error)

// Recover answers a Recover: a handle this driver keeps is RUNNING, or
// GONE (and dropped) when its engine is; else the recorded launch decides
// (RecoverLaunch), and the handle of a running one is built by attach and
// kept.
func (r *Registry[H]) Recover(req *sdk.RecoverRequest, attach AttachFunc[H]) (*sdk.RecoverResponse, error) {
	id := req.InstanceID
	if h, err := r.Get(id); err == nil {
		in := h.Base()
		if in.Alive() {
			return &sdk.RecoverResponse{State: sdk.RecoverStateRunning, Endpoint: *in.Endpoint, Launch: *in.LaunchRecord(), Parked: in.Parked() != "", Detail: "handle kept by this driver"}, nil
		}
		r.Drop(id)
		return &sdk.RecoverResponse{State: sdk.RecoverStateGone, Detail: "the engine process is gone"}, nil
	}
	launched, state, detail := RecoverLaunch(&req.Launch)
	if state != sdk.RecoverStateRunning {
		return &sdk.RecoverResponse{State: state, Detail: detail}, nil
	}
	h, detail, err := attach(launched, detail)
	if err != nil {
		return &sdk.RecoverResponse{State: sdk.RecoverStateUncertain, Detail: err.Error()}, nil
	}
	r.Put(h)
	in := h.Base()
	return &sdk.RecoverResponse{State: sdk.RecoverStateRunning, Endpoint: *in.Endpoint, Launch: *in.LaunchRecord(), Parked: in.Parked() != "", Detail: detail}, nil
}

// WaitExit answers a WaitExit: the kept handle's engine watched until it
// is gone (Instance.WaitExit); instance_not_found for an ID it does not
// keep.
func (r *Registry[H]) WaitExit(ctx context.Context, req *sdk.WaitExitRequest) (*sdk.ExitEvent, error) {
	h, err := r.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	return h.Base().WaitExit(ctx)
}

// Logs answers a Logs: the redacted tail of the kept handle's launch, else
// of the launch directory the request names.
func (r *Registry[H]) Logs(req *sdk.LogsRequest) (*sdk.LogsResponse, error) {
	dir := req.LaunchDir
	if h, err := r.Get(req.InstanceID); err == nil {
		dir = h.Base().Launched.LaunchDir
	}
	if dir == "" {
		return nil, sdk.Errorf(sdk.CodeInstanceNotFound, "no launch directory for %s", req.InstanceID)
	}
	return Logs(dir, req.MaxBytes), nil
}

// Load answers a Load from the engine's /metrics (ReadLoad).
func (r *Registry[H]) Load(ctx context.Context, req *sdk.LoadRequest, names MetricNames) (*sdk.LoadResponse, error) {
	h, err := r.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	in := h.Base()
	if in.Worker() {
		return WorkerLoad(), nil
	}
	return ReadLoad(ctx, in.Client, in.ServedName, names), nil
}
