// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// errorDomain marks ErrorInfo details that carry a CapyCTL catalogue code.
const errorDomain = "capyctl.driver"

// server adapts an sdk.Driver to the generated gRPC service.
type server struct {
	pb.UnimplementedDriverServer
	impl sdk.Driver
}

// toStatus turns a driver error into a gRPC status: ErrNotSupported becomes
// Unimplemented, an *sdk.Error keeps its code in an ErrorInfo detail.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sdk.ErrNotSupported) {
		return status.Error(codes.Unimplemented, err.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	var e *sdk.Error
	if errors.As(err, &e) {
		st := status.New(codes.FailedPrecondition, e.Error())
		if withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: e.Code, Domain: errorDomain}); derr == nil {
			st = withInfo
		}
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

func (s *server) Describe(ctx context.Context, r *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	resp, err := s.impl.Describe(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Detect(ctx context.Context, r *pb.DetectRequest) (*pb.DetectResponse, error) {
	resp, err := s.impl.Detect(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Flags(ctx context.Context, r *pb.FlagsRequest) (*pb.FlagsResponse, error) {
	resp, err := s.impl.Flags(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Plan(ctx context.Context, r *pb.PlanRequest) (*pb.PlanResponse, error) {
	resp, err := s.impl.Plan(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Start(ctx context.Context, r *pb.StartRequest) (*pb.StartResponse, error) {
	resp, err := s.impl.Start(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Probe(ctx context.Context, r *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	resp, err := s.impl.Probe(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Park(ctx context.Context, r *pb.ParkRequest) (*pb.ParkResponse, error) {
	resp, err := s.impl.Park(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Wake(ctx context.Context, r *pb.WakeRequest) (*pb.WakeResponse, error) {
	resp, err := s.impl.Wake(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Abort(ctx context.Context, r *pb.AbortRequest) (*pb.AbortResponse, error) {
	resp, err := s.impl.Abort(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Load(ctx context.Context, r *pb.LoadRequest) (*pb.LoadResponse, error) {
	resp, err := s.impl.Load(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Stop(ctx context.Context, r *pb.StopRequest) (*pb.StopResponse, error) {
	resp, err := s.impl.Stop(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Recover(ctx context.Context, r *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	resp, err := s.impl.Recover(ctx, r)
	return resp, toStatus(err)
}

func (s *server) Logs(ctx context.Context, r *pb.LogsRequest) (*pb.LogsResponse, error) {
	resp, err := s.impl.Logs(ctx, r)
	return resp, toStatus(err)
}

// WaitExit serves the exit stream from an sdk.ExitWaiter: one event, when
// the engine is gone. A driver without it answers Unimplemented.
func (s *server) WaitExit(r *pb.WaitExitRequest, stream pb.Driver_WaitExitServer) error {
	w, ok := s.impl.(sdk.ExitWaiter)
	if !ok {
		return toStatus(sdk.ErrNotSupported)
	}
	ev, err := w.WaitExit(stream.Context(), r)
	if err != nil {
		return toStatus(err)
	}
	return toStatus(stream.Send(ev))
}
