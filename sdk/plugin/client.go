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

// Client is the core's side of a driver: an sdk.Driver over gRPC.
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

func (c *Client) Describe(ctx context.Context, r *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	resp, err := c.rpc.Describe(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Detect(ctx context.Context, r *pb.DetectRequest) (*pb.DetectResponse, error) {
	resp, err := c.rpc.Detect(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Flags(ctx context.Context, r *pb.FlagsRequest) (*pb.FlagsResponse, error) {
	resp, err := c.rpc.Flags(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Plan(ctx context.Context, r *pb.PlanRequest) (*pb.PlanResponse, error) {
	resp, err := c.rpc.Plan(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Start(ctx context.Context, r *pb.StartRequest) (*pb.StartResponse, error) {
	resp, err := c.rpc.Start(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Probe(ctx context.Context, r *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	resp, err := c.rpc.Probe(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Park(ctx context.Context, r *pb.ParkRequest) (*pb.ParkResponse, error) {
	resp, err := c.rpc.Park(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Wake(ctx context.Context, r *pb.WakeRequest) (*pb.WakeResponse, error) {
	resp, err := c.rpc.Wake(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Abort(ctx context.Context, r *pb.AbortRequest) (*pb.AbortResponse, error) {
	resp, err := c.rpc.Abort(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Load(ctx context.Context, r *pb.LoadRequest) (*pb.LoadResponse, error) {
	resp, err := c.rpc.Load(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Stop(ctx context.Context, r *pb.StopRequest) (*pb.StopResponse, error) {
	resp, err := c.rpc.Stop(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Recover(ctx context.Context, r *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	resp, err := c.rpc.Recover(ctx, r)
	return resp, fromStatus(err)
}

func (c *Client) Logs(ctx context.Context, r *pb.LogsRequest) (*pb.LogsResponse, error) {
	resp, err := c.rpc.Logs(ctx, r)
	return resp, fromStatus(err)
}

// WaitExit holds the driver's exit stream until an event says the engine
// exited. A stream that ends without one (the driver went away) is an
// error of the driver_unavailable kind; the caller watches again.
func (c *Client) WaitExit(ctx context.Context, r *pb.WaitExitRequest) (*pb.ExitEvent, error) {
	stream, err := c.rpc.WaitExit(ctx, r)
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
			return ev, nil
		}
	}
}
