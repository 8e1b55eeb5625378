// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// envWireDriver makes this test binary serve wireDriver instead of running
// the tests.
const envWireDriver = "CAPYCTL_TEST_SERVE_WIRE_DRIVER"

func TestMain(m *testing.M) {
	if os.Getenv(envWireDriver) == "1" {
		goplugin.Serve(&goplugin.ServeConfig{
			HandshakeConfig:  Handshake,
			VersionedPlugins: map[int]goplugin.PluginSet{1: {PluginName: &wirePlugin{}}},
			GRPCServer:       goplugin.DefaultGRPCServer,
			Logger:           hclog.NewNullLogger(),
		})
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// wirePlugin serves wireDriver: protocol 1 as the generated service, with
// no SDK Go type in between, which is what a driver built against an SDK
// from before the Go types puts on the wire.
type wirePlugin struct {
	goplugin.NetRPCUnsupportedPlugin
}

func (wirePlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterDriverServer(s, wireDriver{})
	return nil
}

func (wirePlugin) GRPCClient(context.Context, *goplugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, errors.New("server side only")
}

// wireDriver answers with fixed messages and checks what it is sent, field
// by field, in the generated form.
type wireDriver struct {
	pb.UnimplementedDriverServer
}

func (wireDriver) Describe(context.Context, *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	return &pb.DescribeResponse{Name: "wire", Version: "0.1", Protocol: 1, Capabilities: &pb.Capabilities{
		ParkTiers: []string{"deep"}, AbortMode: pb.AbortMode_ABORT_MODE_REQUEST_ID, RequestIdHeader: "X-Request-Id",
	}}, nil
}

func (wireDriver) Start(_ context.Context, r *pb.StartRequest) (*pb.StartResponse, error) {
	var wrong []string
	check := func(what string, got, want any) {
		if got != want {
			wrong = append(wrong, fmt.Sprintf("%s %v, want %v", what, got, want))
		}
	}
	check("deployment.name", r.GetDeployment().GetName(), "chat")
	check("deployment.group.rank", r.GetDeployment().GetGroup().GetRank(), int32(1))
	check("deployment.memory.kv_cache_bytes", r.GetDeployment().GetMemory().GetKvCacheBytes(), int64(1<<20))
	check("launch.port", r.GetLaunch().GetPort(), int32(8123))
	check("launch.device_uuids", strings.Join(r.GetLaunch().GetDeviceUuids(), ","), "GPU-1")
	check("launch.lmcache_server.pgid", r.GetLaunch().GetLmcacheServer().GetPgid(), int32(77))
	check("plan.startup_timeout_ms", r.GetPlan().GetStartupTimeoutMs(), int64(1500))
	check("plan.lmcache.runs", r.GetPlan().GetLmcache().GetRuns(), true)
	check("host is absent", r.GetHost() == nil, true)
	check("engine_key", r.GetEngineKey(), "k")
	if len(wrong) > 0 {
		return nil, status.Error(codes.InvalidArgument, strings.Join(wrong, "; "))
	}
	return &pb.StartResponse{
		Launch: &pb.Launch{Pgid: 42, Processes: []*pb.ProcessIdentity{{Pid: 43, StartTicks: 7, Role: "engine"}}, Port: 8123},
		Endpoint: &pb.Endpoint{BaseUrl: "http://127.0.0.1:8123", AbortMode: pb.AbortMode_ABORT_MODE_REQUEST_ID,
			NonStreamedHangup: pb.NonStreamedHangup_NON_STREAMED_HANGUP_STOPS, OpenRoutes: []string{"/health"}},
	}, nil
}

func (wireDriver) Probe(_ context.Context, r *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	return &pb.ProbeResponse{Ready: r.GetKind() == pb.ProbeKind_PROBE_KIND_READINESS, Alive: true,
		Detail: fmt.Sprintf("%s after %d ms", r.GetInstanceId(), r.GetDeadlineMs()), Endpoint: &pb.Endpoint{BaseUrl: "http://127.0.0.1:8123"}}, nil
}

// Park fails with a code, the way the SDK has always put one on the wire:
// FAILED_PRECONDITION with an ErrorInfo in the capyctl.driver domain.
func (wireDriver) Park(context.Context, *pb.ParkRequest) (*pb.ParkResponse, error) {
	st, err := status.New(codes.FailedPrecondition, "the engine did not sleep").
		WithDetails(&errdetails.ErrorInfo{Reason: sdk.CodeParkFailed, Domain: "capyctl.driver"})
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

func (wireDriver) Stop(_ context.Context, r *pb.StopRequest) (*pb.StopResponse, error) {
	detail := "no launch"
	if l := r.GetLaunch(); l != nil {
		detail = fmt.Sprintf("launch %d", l.GetPgid())
	}
	return &pb.StopResponse{Gone: true, Detail: detail, Cleaned: []string{"/dev/shm/x"}}, nil
}

func (wireDriver) WaitExit(_ *pb.WaitExitRequest, s pb.Driver_WaitExitServer) error {
	if err := s.Send(&pb.ExitEvent{Exited: false}); err != nil {
		return err
	}
	return s.Send(&pb.ExitEvent{Exited: true, ExitCode: 137, LastLogLines: []string{"killed"}})
}

// TestWire_ADriverOfProtocolOneLoads loads a driver process that speaks
// protocol 1 through the generated service only (no SDK Go type), as a
// driver built against an older SDK does, and calls it through the core's
// side: the handshake agrees on protocol 1, each field arrives where the
// .proto puts it, both ways, and errors keep their meaning.
func TestWire_ADriverOfProtocolOneLoads(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envWireDriver+"=1")
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: VersionedPlugins(nil),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
	})
	defer client.Kill()
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("the driver did not load: %v", err)
	}
	if v := client.NegotiatedVersion(); v != 1 {
		t.Fatalf("negotiated protocol %d, want 1", v)
	}
	raw, err := rpc.Dispense(PluginName)
	if err != nil {
		t.Fatal(err)
	}
	drv := raw.(sdk.Driver)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	desc, err := drv.Describe(ctx, &sdk.DescribeRequest{})
	if err != nil || desc.Name != "wire" || desc.Protocol != 1 || desc.Capabilities.AbortMode != sdk.AbortModeRequestID ||
		len(desc.Capabilities.ParkTiers) != 1 || desc.Capabilities.RequestIDHeader != "X-Request-Id" {
		t.Fatalf("Describe: %+v %v", desc, err)
	}

	start, err := drv.Start(ctx, &sdk.StartRequest{
		Deployment: sdk.Deployment{Name: "chat", Group: &sdk.Group{Rank: 1, Size: 2}, Memory: sdk.MemorySizes{KVCacheBytes: 1 << 20}},
		Launch:     sdk.LaunchContext{Port: 8123, DeviceUUIDs: []string{"GPU-1"}, LMCacheServer: &sdk.Launch{Pgid: 77}},
		Plan:       sdk.PlanResponse{StartupTimeout: 1500 * time.Millisecond, LMCache: sdk.LMCachePlan{Runs: true}},
		EngineKey:  "k",
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	l, ep := start.Launch, start.Endpoint
	if l.Pgid != 42 || len(l.Processes) != 1 || *l.Processes[0] != (sdk.ProcessIdentity{Pid: 43, StartTicks: 7, Role: "engine"}) ||
		ep.BaseURL != "http://127.0.0.1:8123" || ep.AbortMode != sdk.AbortModeRequestID ||
		ep.NonStreamedHangup != sdk.NonStreamedHangupStops || len(ep.OpenRoutes) != 1 || start.LMCacheServer != nil {
		t.Fatalf("Start answered %+v", start)
	}

	probe, err := drv.Probe(ctx, &sdk.ProbeRequest{InstanceID: "chat/0", Kind: sdk.ProbeKindReadiness, Deadline: 2 * time.Second})
	if err != nil || !probe.Ready || probe.Detail != "chat/0 after 2000 ms" || probe.Endpoint.BaseURL == "" {
		t.Fatalf("Probe: %+v %v", probe, err)
	}

	for _, c := range []struct {
		req  *sdk.StopRequest
		want string
	}{
		{&sdk.StopRequest{InstanceID: "chat/0"}, "no launch"},
		{&sdk.StopRequest{InstanceID: "chat/0", Launch: &sdk.Launch{Pgid: 42}}, "launch 42"},
	} {
		stop, err := drv.Stop(ctx, c.req)
		if err != nil || !stop.Gone || stop.Detail != c.want || len(stop.Cleaned) != 1 {
			t.Fatalf("Stop(%+v): %+v %v, want %q", c.req, stop, err, c.want)
		}
	}

	_, err = drv.Park(ctx, &sdk.ParkRequest{InstanceID: "chat/0", Tier: "deep"})
	if sdk.CodeOf(err) != sdk.CodeParkFailed || !strings.Contains(err.Error(), "did not sleep") {
		t.Fatalf("Park: %v (code %q), want park_failed", err, sdk.CodeOf(err))
	}
	if _, err := drv.Wake(ctx, &sdk.WakeRequest{InstanceID: "chat/0"}); !errors.Is(err, sdk.ErrNotSupported) {
		t.Fatalf("Wake of a driver without it: %v, want ErrNotSupported", err)
	}

	ev, err := drv.(sdk.ExitWaiter).WaitExit(ctx, &sdk.WaitExitRequest{InstanceID: "chat/0"})
	if err != nil || !ev.Exited || ev.ExitCode != 137 || len(ev.LastLogLines) != 1 {
		t.Fatalf("WaitExit: %+v %v", ev, err)
	}
}

// TestErrors_KeepTheirMeaning: what a driver returns is what the core's
// side reads after the gRPC hop (toStatus, then fromStatus).
func TestErrors_KeepTheirMeaning(t *testing.T) {
	cases := []struct {
		name     string
		err      error
		wantCode string
		wantIs   error
	}{
		{"coded", sdk.Errorf(sdk.CodeLaunchFailed, "exit 1"), sdk.CodeLaunchFailed, nil},
		{"coded and wrapped", fmt.Errorf("start: %w", sdk.Errorf(sdk.CodeInstanceNotFound, "no a/0")), sdk.CodeInstanceNotFound, nil},
		{"not supported", sdk.ErrNotSupported, "", sdk.ErrNotSupported},
		{"deadline", context.DeadlineExceeded, "", context.DeadlineExceeded},
		{"canceled", context.Canceled, "", context.Canceled},
		{"uncoded", errors.New("boom"), "driver_error", nil},
		{"unavailable", status.Error(codes.Unavailable, "gone"), sdk.CodeDriverUnavailable, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wire := c.err
			if _, ok := status.FromError(c.err); !ok {
				wire = toStatus(c.err)
			}
			got := fromStatus(wire)
			if sdk.CodeOf(got) != c.wantCode {
				t.Errorf("code %q, want %q (%v)", sdk.CodeOf(got), c.wantCode, got)
			}
			if c.wantIs != nil && !errors.Is(got, c.wantIs) {
				t.Errorf("%v is not %v", got, c.wantIs)
			}
		})
	}
}
