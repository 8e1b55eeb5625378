// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"context"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// Probe implements sdk.Driver. READINESS waits for the served name in
// /v1/models and a real answer to the canary prompt (reasoning first
// counts), failing at once with the engine's last log lines when it exits.
// A parked (sleeping) engine is reported alive and not ready at once:
// a request to it would wait until it wakes.
func (d *Driver) Probe(ctx context.Context, req *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	in, err := d.reg.Get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	switch req.GetKind() {
	case pb.ProbeKind_PROBE_KIND_LIVENESS:
		return in.Liveness(), nil
	case pb.ProbeKind_PROBE_KIND_READINESS:
		if !in.Alive() {
			return in.ExitInfo("the engine process is gone"), nil
		}
		if tier := in.Parked(); tier != "" {
			return &pb.ProbeResponse{Alive: true, Detail: "the engine is asleep (parked " + tier + "): wake it first"}, nil
		}
		deadline := time.Duration(req.GetDeadlineMs()) * time.Millisecond
		if deadline <= 0 {
			deadline = pyengine.StartupTimeout(pyengine.WeightsBytes(in.ModelDir))
		}
		return in.WaitReady(ctx, deadline, in.ChatReady(canaryPrompt, canaryTokens, nil), nil, nil), nil
	case pb.ProbeKind_PROBE_KIND_WAKE_CHECK:
		if !in.Alive() {
			return in.ExitInfo("the engine process is gone"), nil
		}
		answer, err := wakeCanary(ctx, in)
		if err != nil {
			return &pb.ProbeResponse{Alive: true, Detail: err.Error(), Code: sdk.CodeWakeFailed}, nil
		}
		return &pb.ProbeResponse{Alive: true, Ready: true, Canary: answer, Endpoint: in.Endpoint}, nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.GetKind())
}

// wakeCanary asks the canary prompt once.
func wakeCanary(ctx context.Context, in *pyengine.Instance) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return engineapi.ChatProbe(ctx, in.Client, chatPath, in.ServedName, canaryPrompt, canaryTokens)
}

// Abort implements sdk.Driver: vLLM aborts a request when its connection
// closes; there is nothing to send.
func (d *Driver) Abort(context.Context, *pb.AbortRequest) (*pb.AbortResponse, error) {
	return &pb.AbortResponse{Mode: pb.AbortMode_ABORT_MODE_CLOSE_CONNECTION}, nil
}

// Load implements sdk.Driver: vllm:num_requests_running and _waiting of the
// served model, and the KV cache usage.
func (d *Driver) Load(ctx context.Context, req *pb.LoadRequest) (*pb.LoadResponse, error) {
	in, err := d.reg.Get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	return pyengine.ReadLoad(ctx, in.Client, in.ServedName, metricNames), nil
}

// Stop implements sdk.Driver.
func (d *Driver) Stop(_ context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	var launched proc.Launched
	grace := pyengine.DefaultStopGrace
	if in, err := d.reg.Get(req.GetInstanceId()); err == nil {
		launched, grace = in.Launched, in.StopGrace
		in.Client.CloseIdleConnections()
	} else if l := req.GetLaunch(); l != nil {
		launched = pyengine.FromLaunch(l)
	} else {
		return nil, err
	}
	if req.GetGraceMs() > 0 {
		grace = time.Duration(req.GetGraceMs()) * time.Millisecond
	}
	resp := pyengine.StopLaunch(launched, grace)
	if resp.GetGone() {
		d.reg.Drop(req.GetInstanceId())
	}
	return resp, nil
}

// Recover implements sdk.Driver: it rebuilds the handle from the recorded
// launch and, for a deployment that parks, asks the engine whether it is
// asleep.
func (d *Driver) Recover(ctx context.Context, req *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	id := req.GetInstanceId()
	if in, err := d.reg.Get(id); err == nil {
		if in.Alive() {
			return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: in.Endpoint, Launch: in.LaunchPB(), Parked: in.Parked() != "", Detail: "handle kept by this driver"}, nil
		}
		d.reg.Drop(id)
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: "the engine process is gone"}, nil
	}
	launched, state, detail := pyengine.RecoverLaunch(req.GetLaunch())
	if state != pb.RecoverState_RECOVER_STATE_RUNNING {
		return &pb.RecoverResponse{State: state, Detail: detail}, nil
	}
	dep := req.GetDeployment()
	port := int(req.GetLaunch().GetPort())
	in := d.instance(id, req.GetLaunch().GetLaunchId(), launched, port, req.GetEngineKey(), dep)
	parked := false
	if pyengine.Parks(in.Residency) {
		// vLLM says whether it sleeps: that, not the record, decides.
		asleep, err := isSleeping(ctx, in)
		switch {
		case err != nil:
			return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_UNCERTAIN, Detail: "the engine runs but does not say whether it sleeps: " + err.Error()}, nil
		case asleep:
			tier := req.GetParkTier()
			if tier == "" {
				tier = pyengine.RecordedPark(launched.LaunchDir)
			}
			if tier == "" {
				tier = in.Residency
			}
			in.MarkParked(tier)
			parked = true
			detail += "; the engine is asleep (parked " + tier + ")"
		default:
			in.MarkParked("")
		}
	}
	d.reg.Put(in)
	return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: in.Endpoint, Launch: in.LaunchPB(), Parked: parked, Detail: detail}, nil
}

// Logs implements sdk.Driver.
func (d *Driver) Logs(_ context.Context, req *pb.LogsRequest) (*pb.LogsResponse, error) {
	dir := req.GetLaunchDir()
	if in, err := d.reg.Get(req.GetInstanceId()); err == nil {
		dir = in.Launched.LaunchDir
	}
	if dir == "" {
		return nil, sdk.Errorf(sdk.CodeInstanceNotFound, "no launch directory for %s", req.GetInstanceId())
	}
	return pyengine.Logs(dir, req.GetMaxBytes()), nil
}
