// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package tensorfold

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// canaryPrompt is the fixed prompt whose answer proves readiness.
const canaryPrompt = "Say ready."

// health is TensorFold's GET /health.
type health struct {
	OK              bool   `json:"ok"`
	Status          string `json:"status"`
	RequestsRunning *int64 `json:"requests_running"`
	RequestsWaiting *int64 `json:"requests_waiting"`
	Busy            *bool  `json:"busy"`
}

// Probe implements sdk.Driver. Readiness is /health ok, the served name in
// /v1/models, then a real answer; the first answer waits for the kernel
// build, which each attempt joins until the startup budget runs out.
func (d *Driver) Probe(ctx context.Context, req *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	in, err := d.reg.Get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	switch req.GetKind() {
	case pb.ProbeKind_PROBE_KIND_LIVENESS:
		return settled(in.Liveness(), in.Launched.LaunchDir), nil
	case pb.ProbeKind_PROBE_KIND_READINESS, pb.ProbeKind_PROBE_KIND_WAKE_CHECK:
		deadline := time.Duration(req.GetDeadlineMs()) * time.Millisecond
		if deadline <= 0 {
			deadline = StartupTimeout
		}
		chat := in.ChatReady(canaryPrompt, 8, nil)
		ready := func(ctx context.Context) (bool, string, string) {
			var h health
			if _, err := in.Client.GetJSON(ctx, "/health", &h); err != nil || !h.OK {
				return false, "", "waiting for /health"
			}
			return chat(ctx)
		}
		return settled(in.WaitReady(ctx, deadline, ready, nil, nil), in.Launched.LaunchDir), nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.GetKind())
}

// Load implements sdk.Driver: the idle signal is /health's
// requests_running and busy (a busy engine with nothing counted is
// building kernels for a request).
func (d *Driver) Load(ctx context.Context, req *pb.LoadRequest) (*pb.LoadResponse, error) {
	in, err := d.reg.Get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	unknown := &pb.LoadResponse{Known: false, KvUsage: -1}
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var h health
	status, err := in.Client.GetJSON(lctx, "/health", &h)
	if err != nil || status != http.StatusOK || h.RequestsRunning == nil || h.Busy == nil {
		return unknown, nil
	}
	out := &pb.LoadResponse{Known: true, Running: *h.RequestsRunning, KvUsage: -1}
	if h.RequestsWaiting != nil {
		out.Waiting = *h.RequestsWaiting
	}
	if *h.Busy && out.Running == 0 && out.Waiting == 0 {
		out.Running = 1
	}
	return out, nil
}

// Stop implements sdk.Driver.
func (d *Driver) Stop(_ context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	grace := pyengine.DefaultStopGrace
	if req.GetGraceMs() > 0 {
		grace = time.Duration(req.GetGraceMs()) * time.Millisecond
	}
	in, err := d.reg.Get(req.GetInstanceId())
	var resp *pb.StopResponse
	switch {
	case err == nil:
		resp = pyengine.StopLaunch(in.Launched, grace)
	case req.GetLaunch() != nil:
		resp = pyengine.StopLaunch(pyengine.FromLaunch(req.GetLaunch()), grace)
	default:
		return nil, err
	}
	if resp.GetGone() {
		if in != nil {
			in.Client.CloseIdleConnections()
		}
		d.reg.Drop(req.GetInstanceId())
	}
	return resp, nil
}

// Recover implements sdk.Driver.
func (d *Driver) Recover(_ context.Context, req *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	if in, err := d.reg.Get(req.GetInstanceId()); err == nil {
		if in.Alive() {
			return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: in.Endpoint, Launch: in.LaunchPB(), Detail: "handle kept by this driver"}, nil
		}
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: "the engine process is gone"}, nil
	}
	launched, state, detail := pyengine.RecoverLaunch(req.GetLaunch())
	if state != pb.RecoverState_RECOVER_STATE_RUNNING {
		return &pb.RecoverResponse{State: state, Detail: detail}, nil
	}
	l := req.GetLaunch()
	in := pyengine.NewInstance(req.GetInstanceId(), l.GetLaunchId(), launched, int(l.GetPort()), endpoint(int(l.GetPort()), req.GetDeployment().GetServedName()))
	in.API, in.ModelDir, in.Residency = req.GetDeployment().GetApi(), req.GetDeployment().GetModelDir(), pyengine.ResidencyRestartOnly
	d.reg.Put(in)
	return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: in.Endpoint, Launch: in.LaunchPB(), Detail: detail}, nil
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

// settled completes the answer about an engine that exited: its status is
// recorded by the launch shim a moment after the process dies, so an exit
// code of -1 is read again, for at most two seconds, with the log lines
// written meanwhile. (A workaround kept here: the shared
// pyengine.Instance.ExitInfo reads the status once.)
func settled(p *pb.ProbeResponse, launchDir string) *pb.ProbeResponse {
	if !p.GetExited() || p.GetExitCode() != -1 || launchDir == "" {
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = engineapi.Poll(ctx, func(context.Context) (bool, error) {
		st, err := proc.ReadStatus(launchDir)
		if err == nil && st.Exited || errors.Is(err, proc.ErrNoStatus) {
			if st.Exited {
				p.ExitCode = int32(st.ExitCode)
			}
			p.LastLogLines = proc.LastLines(launchDir, 20)
			return true, nil
		}
		return false, nil
	})
	return p
}
