// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// TestProbe runs the driver's readiness check against the testkit's fake
// engine, which speaks the OpenAI API the way real engines do.
func TestProbe(t *testing.T) {
	eng, err := fakeengine.New(fakeengine.Config{ServedName: "demo", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(eng.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = eng.Run(ctx) }()
	<-eng.Ready()

	d := New()
	d.Track("demo/0", &pb.Endpoint{BaseUrl: srv.URL, AuthHeader: "Authorization", AuthValue: "Bearer k",
		ChatPath: "/v1/chat/completions", ServedName: "demo"})
	resp, err := d.Probe(ctx, &pb.ProbeRequest{InstanceId: "demo/0", Kind: pb.ProbeKind_PROBE_KIND_READINESS})
	if err != nil || !resp.GetReady() || resp.GetCanary() == "" {
		t.Fatalf("readiness: %+v %v", resp, err)
	}
	if _, err := d.Probe(ctx, &pb.ProbeRequest{InstanceId: "nope/0"}); sdk.CodeOf(err) != sdk.CodeInstanceNotFound {
		t.Fatalf("unknown instance: %v", err)
	}
}

func TestDescribeDetectFlags(t *testing.T) {
	ctx := context.Background()
	d := New()
	desc, err := d.Describe(ctx, &pb.DescribeRequest{})
	if err != nil || desc.GetName() != Family || desc.GetProtocol() != sdk.ProtocolVersion || len(desc.GetCapabilities().GetParkTiers()) != 0 {
		t.Fatalf("describe: %+v %v", desc, err)
	}
	if _, err := d.Detect(ctx, &pb.DetectRequest{Path: filepath.Join(t.TempDir(), "missing")}); sdk.CodeOf(err) != sdk.CodeEngineNotFound {
		t.Fatalf("detect a missing program: %v", err)
	}
	flags, err := d.Flags(ctx, &pb.FlagsRequest{})
	if err != nil || len(flags.GetRules()) != 3 {
		t.Fatalf("flags: %+v %v", flags, err)
	}
	// What the driver does not implement is declared, not faked.
	if _, err := d.Park(ctx, &pb.ParkRequest{}); !errors.Is(err, sdk.ErrNotSupported) {
		t.Fatalf("park: %v", err)
	}
}
