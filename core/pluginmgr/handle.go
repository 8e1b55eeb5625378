// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"time"

	"github.com/capyctl/capyctl/sdk"
	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
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

var (
	_ sdk.Driver     = (*handle)(nil)
	_ sdk.ExitWaiter = (*handle)(nil)
)

// exitNoticeBound bounds the wait, after a transport error, for a dead
// driver's exit to be noticed (go-plugin reaps it within milliseconds); a
// driver still running past it is called again as it is.
const exitNoticeBound = 5 * time.Second

// awaitExit waits until the driver process behind rpc is seen exited (or
// replaced, or being relaunched), ctx ends, or bound passes.
func (d *driverProc) awaitExit(ctx context.Context, rpc *sdkplugin.Client, bound time.Duration) {
	deadline := time.Now().Add(bound)
	for {
		d.mu.Lock()
		done := d.rpc != rpc || d.client == nil || d.client.Exited() || d.launching != nil
		d.mu.Unlock()
		if done || ctx.Err() != nil || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// call runs one driver call under its deadline (Deadlines, by kind): a
// driver that does not answer in time (hung, stopped) gives driver_timeout
// instead of holding the caller, and the supervisor's pings replace it.
func call[Req any, Resp any](ctx context.Context, h *handle, method string, retry bool, req Req,
	f func(c sdk.Driver, ctx context.Context, req Req) (Resp, error)) (Resp, error) {
	var zero Resp
	cctx, cancel, check := withDeadline(ctx, h.d.family, method, h.m.cfg.Deadlines.bound(method, req))
	defer cancel()
	c, err := h.d.ensure(cctx, h.m)
	if err != nil {
		return zero, check(err)
	}
	resp, err := f(c, cctx, req)
	if err != nil && isTransport(err) && retry {
		// The driver may have just died: wait until its process is seen
		// exited, so that ensure relaunches it instead of handing back the
		// same dead connection.
		h.d.awaitExit(cctx, c, exitNoticeBound)
		c, err2 := h.d.ensure(cctx, h.m)
		if err2 != nil {
			return zero, check(err)
		}
		resp, err = f(c, cctx, req)
	}
	if fault := replyFault(h.d, method, err); fault != nil {
		return zero, fault
	}
	if err == nil {
		h.d.mu.Lock()
		negotiated := h.d.protocol
		h.d.mu.Unlock()
		if what := checkReply(method, negotiated, resp); what != "" {
			return zero, malformed(h.d, method, nil, what)
		}
	}
	return resp, check(err)
}

func (h *handle) Describe(ctx context.Context, r *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return call(ctx, h, "Describe", true, r, sdk.Driver.Describe)
}
func (h *handle) Detect(ctx context.Context, r *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	return call(ctx, h, "Detect", true, r, sdk.Driver.Detect)
}
func (h *handle) Flags(ctx context.Context, r *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	return call(ctx, h, "Flags", true, r, sdk.Driver.Flags)
}
func (h *handle) Plan(ctx context.Context, r *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	return call(ctx, h, "Plan", true, r, sdk.Driver.Plan)
}
func (h *handle) Start(ctx context.Context, r *sdk.StartRequest) (*sdk.StartResponse, error) {
	return call(ctx, h, "Start", false, r, sdk.Driver.Start)
}
func (h *handle) Probe(ctx context.Context, r *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	return call(ctx, h, "Probe", true, r, sdk.Driver.Probe)
}
func (h *handle) Park(ctx context.Context, r *sdk.ParkRequest) (*sdk.ParkResponse, error) {
	return call(ctx, h, "Park", false, r, sdk.Driver.Park)
}
func (h *handle) Wake(ctx context.Context, r *sdk.WakeRequest) (*sdk.WakeResponse, error) {
	return call(ctx, h, "Wake", false, r, sdk.Driver.Wake)
}
func (h *handle) Abort(ctx context.Context, r *sdk.AbortRequest) (*sdk.AbortResponse, error) {
	return call(ctx, h, "Abort", false, r, sdk.Driver.Abort)
}
func (h *handle) Load(ctx context.Context, r *sdk.LoadRequest) (*sdk.LoadResponse, error) {
	return call(ctx, h, "Load", true, r, sdk.Driver.Load)
}
func (h *handle) Stop(ctx context.Context, r *sdk.StopRequest) (*sdk.StopResponse, error) {
	// Stop with a recorded launch is safe to repeat: it proves the group
	// gone whether or not an earlier attempt signalled it.
	return call(ctx, h, "Stop", true, r, sdk.Driver.Stop)
}
func (h *handle) Recover(ctx context.Context, r *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	return call(ctx, h, "Recover", true, r, sdk.Driver.Recover)
}
func (h *handle) Logs(ctx context.Context, r *sdk.LogsRequest) (*sdk.LogsResponse, error) {
	return call(ctx, h, "Logs", true, r, sdk.Driver.Logs)
}

// WaitExit holds the family's driver's exit stream for one instance. It has
// no deadline (it lasts as long as the engine runs; ctx ends it) and is
// never retried here: a driver that dies or is replaced ends it with
// driver_unavailable, and the caller watches again once the driver is
// back. A driver that does not serve the stream answers
// sdk.ErrNotSupported.
func (h *handle) WaitExit(ctx context.Context, r *sdk.WaitExitRequest) (*sdk.ExitEvent, error) {
	c, err := h.d.ensure(ctx, h.m)
	if err != nil {
		return nil, err
	}
	ev, err := c.WaitExit(ctx, r)
	if fault := replyFault(h.d, "WaitExit", err); fault != nil {
		return nil, fault
	}
	return ev, err
}
