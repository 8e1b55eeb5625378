// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"errors"
	"io"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// Client is the core's side of a driver: an sdk.Driver over gRPC. Each call
// converts the Go request to its protobuf message and the answer back
// (convert.go).
// codes.Unimplemented comes back as sdk.ErrNotSupported and a coded driver
// failure as an *sdk.Error with its code.
type Client struct {
	rpc pb.DriverClient
}

var (
	_ sdk.Driver     = (*Client)(nil)
	_ sdk.ExitWaiter = (*Client)(nil)
)

// NewClient wraps a gRPC connection to a driver.
func NewClient(conn grpc.ClientConnInterface) *Client {
	return &Client{rpc: pb.NewDriverClient(conn)}
}

// fromStatus maps a gRPC error back to the SDK's error forms.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unimplemented:
		return sdk.ErrNotSupported
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	case codes.Canceled:
		return context.Canceled
	case codes.Unavailable:
		return &sdk.Error{Code: sdk.CodeDriverUnavailable, Message: st.Message()}
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == errorDomain {
			return &sdk.Error{Code: info.Reason, Message: st.Message()}
		}
	}
	return &sdk.Error{Code: "driver_error", Message: st.Message()}
}

func (c *Client) Describe(ctx context.Context, r *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	resp, err := c.rpc.Describe(ctx, describeRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, describeResponseFromPB), nil
}

func (c *Client) Detect(ctx context.Context, r *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	resp, err := c.rpc.Detect(ctx, detectRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, detectResponseFromPB), nil
}

func (c *Client) Flags(ctx context.Context, r *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	resp, err := c.rpc.Flags(ctx, flagsRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, flagsResponseFromPB), nil
}

func (c *Client) Plan(ctx context.Context, r *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	resp, err := c.rpc.Plan(ctx, planRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, planResponseFromPB), nil
}

func (c *Client) Start(ctx context.Context, r *sdk.StartRequest) (*sdk.StartResponse, error) {
	resp, err := c.rpc.Start(ctx, startRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, startResponseFromPB), nil
}

func (c *Client) Probe(ctx context.Context, r *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	resp, err := c.rpc.Probe(ctx, probeRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, probeResponseFromPB), nil
}

func (c *Client) Park(ctx context.Context, r *sdk.ParkRequest) (*sdk.ParkResponse, error) {
	resp, err := c.rpc.Park(ctx, parkRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, parkResponseFromPB), nil
}

func (c *Client) Wake(ctx context.Context, r *sdk.WakeRequest) (*sdk.WakeResponse, error) {
	resp, err := c.rpc.Wake(ctx, wakeRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, wakeResponseFromPB), nil
}

func (c *Client) Abort(ctx context.Context, r *sdk.AbortRequest) (*sdk.AbortResponse, error) {
	resp, err := c.rpc.Abort(ctx, abortRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, abortResponseFromPB), nil
}

func (c *Client) Load(ctx context.Context, r *sdk.LoadRequest) (*sdk.LoadResponse, error) {
	resp, err := c.rpc.Load(ctx, loadRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, loadResponseFromPB), nil
}

func (c *Client) Stop(ctx context.Context, r *sdk.StopRequest) (*sdk.StopResponse, error) {
	resp, err := c.rpc.Stop(ctx, stopRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, stopResponseFromPB), nil
}

func (c *Client) Recover(ctx context.Context, r *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	resp, err := c.rpc.Recover(ctx, recoverRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, recoverResponseFromPB), nil
}

func (c *Client) Logs(ctx context.Context, r *sdk.LogsRequest) (*sdk.LogsResponse, error) {
	resp, err := c.rpc.Logs(ctx, logsRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	return ptrFromPB(resp, logsResponseFromPB), nil
}

// WaitExit holds the driver's exit stream until an event says the engine
// exited. A stream that ends without one (the driver went away) is an
// error of the driver_unavailable kind; the caller watches again.
func (c *Client) WaitExit(ctx context.Context, r *sdk.WaitExitRequest) (*sdk.ExitEvent, error) {
	stream, err := c.rpc.WaitExit(ctx, waitExitRequestToPB(r))
	if err != nil {
		return nil, fromStatus(err)
	}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, &sdk.Error{Code: sdk.CodeDriverUnavailable, Message: "the driver ended the exit stream without an exit"}
		}
		if err != nil {
			return nil, fromStatus(err)
		}
		if ev.GetExited() {
			return ptrFromPB(ev, exitEventFromPB), nil
		}
	}
}
