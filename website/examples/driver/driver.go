// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"sync"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// Family is the engine family this driver serves: deployments say
// engine = "hello" (or the name the engine was registered under).
const Family = "hello"

// Driver serves "hello" engines: any program that speaks the OpenAI chat
// API. It answers Describe, Detect, Flags and Probe; the embedded
// UnimplementedDriver answers every other call with ErrNotSupported,
// which the role reads as "this driver cannot" (drivers/custom shows Plan,
// Start, Stop, Recover and Logs built on sdk/proc).
type Driver struct {
	sdk.UnimplementedDriver

	mu        sync.Mutex
	endpoints map[string]*pb.Endpoint // by instance ID, filled by Start
}

// New returns a driver.
func New() *Driver { return &Driver{endpoints: map[string]*pb.Endpoint{}} }

// Describe names the driver and declares what it can do. The role reads
// capabilities from here and refuses a deployment that needs one the
// driver lacks, instead of guessing.
func (d *Driver) Describe(context.Context, *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	return &pb.DescribeResponse{
		Name:     Family,
		Version:  "0.1.0",
		Protocol: sdk.ProtocolVersion,
		Capabilities: &pb.Capabilities{
			// No park tiers: the engine is restart only.
			Apis:      []string{"chat"},
			AbortMode: pb.AbortMode_ABORT_MODE_CLOSE_CONNECTION,
		},
	}, nil
}

// Detect inspects what the operator named in capyctl engine add: the
// program must exist and be executable. The digest pins it: the role
// refuses to launch a changed program.
func (d *Driver) Detect(_ context.Context, req *pb.DetectRequest) (*pb.DetectResponse, error) {
	st, err := os.Stat(req.GetPath())
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "program %s: %v", req.GetPath(), err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "%s is not an executable program", req.GetPath())
	}
	f, err := os.Open(req.GetPath())
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "read %s: %v", req.GetPath(), err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "read %s: %v", req.GetPath(), err)
	}
	return &pb.DetectResponse{
		Family:  Family,
		Version: "unknown",
		Digest:  "sha256:" + hex.EncodeToString(h.Sum(nil)),
		Program: req.GetPath(),
		Notes:   []string{"hello engines run restart only"},
	}, nil
}

// Flags is the flag policy capyctl engine flags prints: options the driver
// renders itself are owned, and a deployment may not pass them.
func (d *Driver) Flags(context.Context, *pb.FlagsRequest) (*pb.FlagsResponse, error) {
	owned := func(name, why string) *pb.FlagRule {
		return &pb.FlagRule{Name: name, Kind: pb.FlagKind_FLAG_KIND_OPTION, Class: pb.FlagClass_FLAG_CLASS_OWNED, Reason: why}
	}
	return &pb.FlagsResponse{Family: Family, Rules: []*pb.FlagRule{
		owned("--host", "the engine listens on loopback only"),
		owned("--port", "the role leases the port"),
		owned("--model", "rendered from the deployment's model"),
	}}, nil
}

// Track records the endpoint of a started instance (Start would call it).
func (d *Driver) Track(instanceID string, ep *pb.Endpoint) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.endpoints[instanceID] = ep
}

// Probe answers liveness and readiness. Readiness is never "the port
// answers": the engine must list the served name and answer a real
// request.
func (d *Driver) Probe(ctx context.Context, req *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	d.mu.Lock()
	ep, ok := d.endpoints[req.GetInstanceId()]
	d.mu.Unlock()
	if !ok {
		return nil, sdk.Errorf(sdk.CodeInstanceNotFound, "no instance %s", req.GetInstanceId())
	}
	c := engineapi.NewEngineClient(ep.GetBaseUrl(), ep.GetAuthHeader(), ep.GetAuthValue())
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	listed, err := engineapi.ModelsContain(pctx, c, ep.GetServedName())
	if err != nil || !listed {
		return &pb.ProbeResponse{Alive: err == nil, Detail: "the model is not listed yet"}, nil
	}
	if req.GetKind() == pb.ProbeKind_PROBE_KIND_LIVENESS {
		return &pb.ProbeResponse{Alive: true}, nil
	}
	answer, err := engineapi.ChatProbe(pctx, c, ep.GetChatPath(), ep.GetServedName(), "Say ready.", 8)
	if err != nil {
		return &pb.ProbeResponse{Alive: true, Detail: err.Error()}, nil
	}
	return &pb.ProbeResponse{Alive: true, Ready: true, Canary: answer, Endpoint: ep}, nil
}
