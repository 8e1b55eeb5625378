// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"

	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// handle is the sdk.Driver the rest of the core holds. It routes each call
// to the family's current driver process; when that process is gone it
// relaunches it and, for calls that are safe to repeat, retries once. Calls
// with effects (Start, Park, Wake, Abort) are never retried blind: their
// outcome is unknown and the caller decides.
type handle struct {
	m *Manager
	d *driverProc
}

var _ sdk.Driver = (*handle)(nil)

func call[Req any, Resp any](ctx context.Context, h *handle, retry bool, req Req,
	f func(c sdk.Driver, ctx context.Context, req Req) (Resp, error)) (Resp, error) {
	var zero Resp
	c, err := h.d.ensure(ctx, h.m)
	if err != nil {
		return zero, err
	}
	resp, err := f(c, ctx, req)
	if err != nil && isTransport(err) && retry {
		c, err2 := h.d.ensure(ctx, h.m)
		if err2 != nil {
			return zero, err
		}
		return f(c, ctx, req)
	}
	return resp, err
}

func (h *handle) Describe(ctx context.Context, r *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	return call(ctx, h, true, r, sdk.Driver.Describe)
}
func (h *handle) Detect(ctx context.Context, r *pb.DetectRequest) (*pb.DetectResponse, error) {
	return call(ctx, h, true, r, sdk.Driver.Detect)
}
func (h *handle) Flags(ctx context.Context, r *pb.FlagsRequest) (*pb.FlagsResponse, error) {
	return call(ctx, h, true, r, sdk.Driver.Flags)
}
func (h *handle) Plan(ctx context.Context, r *pb.PlanRequest) (*pb.PlanResponse, error) {
	return call(ctx, h, true, r, sdk.Driver.Plan)
}
func (h *handle) Start(ctx context.Context, r *pb.StartRequest) (*pb.StartResponse, error) {
	return call(ctx, h, false, r, sdk.Driver.Start)
}
func (h *handle) Probe(ctx context.Context, r *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	return call(ctx, h, true, r, sdk.Driver.Probe)
}
func (h *handle) Park(ctx context.Context, r *pb.ParkRequest) (*pb.ParkResponse, error) {
	return call(ctx, h, false, r, sdk.Driver.Park)
}
func (h *handle) Wake(ctx context.Context, r *pb.WakeRequest) (*pb.WakeResponse, error) {
	return call(ctx, h, false, r, sdk.Driver.Wake)
}
func (h *handle) Abort(ctx context.Context, r *pb.AbortRequest) (*pb.AbortResponse, error) {
	return call(ctx, h, false, r, sdk.Driver.Abort)
}
func (h *handle) Load(ctx context.Context, r *pb.LoadRequest) (*pb.LoadResponse, error) {
	return call(ctx, h, true, r, sdk.Driver.Load)
}
func (h *handle) Stop(ctx context.Context, r *pb.StopRequest) (*pb.StopResponse, error) {
	// Stop with a recorded launch is safe to repeat: it proves the group
	// gone whether or not an earlier attempt signalled it.
	return call(ctx, h, true, r, sdk.Driver.Stop)
}
func (h *handle) Recover(ctx context.Context, r *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	return call(ctx, h, true, r, sdk.Driver.Recover)
}
func (h *handle) Logs(ctx context.Context, r *pb.LogsRequest) (*pb.LogsResponse, error) {
	return call(ctx, h, true, r, sdk.Driver.Logs)
}
