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

// server adapts an sdk.Driver to the generated gRPC service: each call
// converts the protobuf request to its Go type, calls the driver, and
// converts the Go answer back (convert.go).
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
	req := describeRequestFromPB(r)
	resp, err := s.impl.Describe(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return describeResponseToPB(resp), nil
}

func (s *server) Detect(ctx context.Context, r *pb.DetectRequest) (*pb.DetectResponse, error) {
	req := detectRequestFromPB(r)
	resp, err := s.impl.Detect(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return detectResponseToPB(resp), nil
}

func (s *server) Flags(ctx context.Context, r *pb.FlagsRequest) (*pb.FlagsResponse, error) {
	req := flagsRequestFromPB(r)
	resp, err := s.impl.Flags(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return flagsResponseToPB(resp), nil
}

func (s *server) Plan(ctx context.Context, r *pb.PlanRequest) (*pb.PlanResponse, error) {
	req := planRequestFromPB(r)
	resp, err := s.impl.Plan(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return planResponseToPB(resp), nil
}

func (s *server) Start(ctx context.Context, r *pb.StartRequest) (*pb.StartResponse, error) {
	req := startRequestFromPB(r)
	resp, err := s.impl.Start(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return startResponseToPB(resp), nil
}

func (s *server) Probe(ctx context.Context, r *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	req := probeRequestFromPB(r)
	resp, err := s.impl.Probe(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return probeResponseToPB(resp), nil
}

func (s *server) Park(ctx context.Context, r *pb.ParkRequest) (*pb.ParkResponse, error) {
	req := parkRequestFromPB(r)
	resp, err := s.impl.Park(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return parkResponseToPB(resp), nil
}

func (s *server) Wake(ctx context.Context, r *pb.WakeRequest) (*pb.WakeResponse, error) {
	req := wakeRequestFromPB(r)
	resp, err := s.impl.Wake(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return wakeResponseToPB(resp), nil
}

func (s *server) Abort(ctx context.Context, r *pb.AbortRequest) (*pb.AbortResponse, error) {
	req := abortRequestFromPB(r)
	resp, err := s.impl.Abort(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return abortResponseToPB(resp), nil
}

func (s *server) Load(ctx context.Context, r *pb.LoadRequest) (*pb.LoadResponse, error) {
	req := loadRequestFromPB(r)
	resp, err := s.impl.Load(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return loadResponseToPB(resp), nil
}

func (s *server) Stop(ctx context.Context, r *pb.StopRequest) (*pb.StopResponse, error) {
	req := stopRequestFromPB(r)
	resp, err := s.impl.Stop(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return stopResponseToPB(resp), nil
}

func (s *server) Recover(ctx context.Context, r *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	req := recoverRequestFromPB(r)
	resp, err := s.impl.Recover(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return recoverResponseToPB(resp), nil
}

func (s *server) Logs(ctx context.Context, r *pb.LogsRequest) (*pb.LogsResponse, error) {
	req := logsRequestFromPB(r)
	resp, err := s.impl.Logs(ctx, &req)
	if err != nil {
		return nil, toStatus(err)
	}
	return logsResponseToPB(resp), nil
}

// WaitExit serves the exit stream from an sdk.ExitWaiter: one event, when
// the engine is gone. A driver without it answers Unimplemented.
func (s *server) WaitExit(r *pb.WaitExitRequest, stream pb.Driver_WaitExitServer) error {
	w, ok := s.impl.(sdk.ExitWaiter)
	if !ok {
		return toStatus(sdk.ErrNotSupported)
	}
	req := waitExitRequestFromPB(r)
	ev, err := w.WaitExit(stream.Context(), &req)
	if err != nil {
		return toStatus(err)
	}
	return toStatus(stream.Send(exitEventToPB(ev)))
}
