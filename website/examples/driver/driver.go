// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"os"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/flags"
	"github.com/capyctl/capyctl/sdk/proc"
)

// Family is the engine family this driver serves: capyctl engine add
// <program> --family hello registers a program for it.
const Family = "hello"

const (
	// version is this driver's version, reported by Describe.
	version = "0.2.0"
	// keyEnv hands the engine its per-launch API key.
	keyEnv = "FAKE_ENGINE_API_KEY"
	// startupTimeout bounds readiness when the core sets no deadline.
	startupTimeout = 2 * time.Minute
	// stopGrace is how long the engine may take to end after SIGTERM.
	stopGrace = 10 * time.Second
)

// table is the flag policy: what the driver renders itself (owned), and the
// environment names every engine treats alike. Plan refuses a deployment
// that sets an owned one; capyctl engine flags hello prints it.
var table = &flags.Table{Family: Family, Rules: append([]flags.Rule{
	{Name: "--host", Kind: flags.Option, Class: flags.Owned, Reason: "the engine listens on loopback only"},
	{Name: "--port", Kind: flags.Option, Class: flags.Owned, Reason: "CapyCTL leases the port"},
	{Name: "--served-name", Kind: flags.Option, Class: flags.Owned, Reason: "rendered from the deployment"},
	{Name: keyEnv, Kind: flags.Env, Class: flags.Owned, Reason: "receives the per-launch key"},
}, flags.CommonEnvRules()...)}

// metrics are the engine's Prometheus gauges of the idle signal.
var metrics = enginekit.MetricNames{Running: "fake:requests_running", Waiting: "fake:requests_waiting"}

// Driver serves "hello" engines: programs started as
// `<program> serve --host H --port P --served-name N` that speak the OpenAI
// chat API, read their key from $FAKE_ENGINE_API_KEY and count requests in
// /metrics (the testkit's capyctl-fake-engine is one). They cannot park:
// RestartOnly answers Park, Wake and Abort.
type Driver struct {
	enginekit.RestartOnly
	reg *enginekit.Registry[*enginekit.Instance]
}

// New returns a driver with no instances.
func New() *Driver { return &Driver{reg: enginekit.NewRegistry[*enginekit.Instance]()} }

// Describe names the driver and declares what it can do.
func (d *Driver) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	caps := &sdk.Capabilities{APIs: []string{"chat"}, AbortMode: sdk.AbortModeCloseConnection, IdleSignal: true}
	return enginekit.Describe(Family, version, caps, ""), nil
}

// Detect checks the program capyctl engine add names and pins its digest.
func (d *Driver) Detect(_ context.Context, req *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	st, err := os.Stat(req.Path)
	if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "%s is not an executable program", req.Path)
	}
	digest, err := enginekit.FileDigest(req.Path)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "read %s: %v", req.Path, err)
	}
	return &sdk.DetectResponse{Family: Family, Version: "unknown", Digest: digest, Program: req.Path,
		Notes: []string{"hello engines run restart only"}}, nil
}

// Flags returns the flag policy.
func (d *Driver) Flags(context.Context, *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	return table.Response(), nil
}

// Plan refuses what the engine cannot do, then renders the command line and
// the environment (never the key: Start adds it).
func (d *Driver) Plan(_ context.Context, req *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	dep, host, lctx := &req.Deployment, &req.Host, &req.Launch
	var r enginekit.Refusals
	enginekit.CheckOptions(table, dep, host, nil, &r)
	if res := dep.Residency; res != "" && res != enginekit.ResidencyRestartOnly {
		r.Add(enginekit.CodeCapabilityMissing+":deep_park", "residency", "hello engines do not park: set residency = %q", enginekit.ResidencyRestartOnly)
	}
	if api := dep.API; api != "" && api != "chat" {
		r.Add(enginekit.CodeCapabilityMissing+":"+api, "api", "hello engines serve the chat API only")
	}
	resp := &sdk.PlanResponse{Residency: enginekit.ResidencyRestartOnly, StartupTimeout: startupTimeout, Refusals: r}
	if len(r) > 0 {
		return resp, nil
	}
	port := "{{port}}" // a plan checked before there is a launch
	if lctx.Port > 0 {
		port = strconv.Itoa(int(lctx.Port))
	}
	resp.Argv = append([]string{req.Installation.Path, "serve", "--host", "127.0.0.1", "--port", port,
		"--served-name", dep.ServedName}, dep.ExtraArgs...)
	env := enginekit.NewEnv(enginekit.SystemPath)
	env.PinDevices(lctx)
	env.NoTelemetry(host)
	env.Merge(host.HostEnv)
	env.Merge(dep.Env)
	resp.Env, resp.Workdir = env, lctx.LaunchDir
	return resp, nil
}

// Start runs the plan behind the launch shim, the key in the environment
// and redacted from the output, and keeps the instance.
func (d *Driver) Start(_ context.Context, req *sdk.StartRequest) (*sdk.StartResponse, error) {
	inst, lctx, key := &req.Installation, &req.Launch, req.EngineKey
	// IMPORTANT: the program registered and pinned must be what runs.
	if digest, err := enginekit.FileDigest(inst.Path); err != nil || digest != inst.Digest {
		return nil, sdk.Errorf(enginekit.CodeInstallationDrift, "%s changed since it was registered: capyctl engine add it again", inst.Path)
	}
	launched, err := enginekit.StartLaunch(enginekit.LaunchOptions{Plan: &req.Plan, Host: &req.Host, Launch: lctx,
		SecretEnv: map[string]string{keyEnv: key}, Secrets: []string{key, req.AdminKey}})
	if err != nil {
		return nil, err
	}
	served := req.Deployment.ServedName
	return d.reg.Started(instance(lctx.InstanceID, lctx.LaunchID, *launched, int(lctx.Port), served, key)), nil
}

// instance is the handle of a launch: the router reaches the engine on its
// loopback port with the key; only /health answers without it.
func instance(id, launchID string, l proc.Launched, port int, served, key string) *enginekit.Instance {
	ep := enginekit.Exposure{OpenRoutes: []string{"/health"}, Note: "the engine has no Unix socket option"}.
		Apply(enginekit.NewEndpoint(port, served, key))
	in := enginekit.NewInstance(id, launchID, l, port, ep)
	in.API, in.Residency, in.StopGrace = "chat", enginekit.ResidencyRestartOnly, stopGrace
	return in
}

// Probe answers liveness from the process table, and readiness once the
// engine lists the served name and answers a real request.
func (d *Driver) Probe(ctx context.Context, req *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	in, err := d.reg.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	if req.Kind == sdk.ProbeKindLiveness {
		return in.Liveness(), nil
	}
	return in.WaitReady(ctx, enginekit.ProbeDeadline(req, startupTimeout), in.ChatReady("Say ready.", 8, nil), nil, nil), nil
}

// Load reads the idle signal from the engine's /metrics.
func (d *Driver) Load(ctx context.Context, req *sdk.LoadRequest) (*sdk.LoadResponse, error) {
	return d.reg.Load(ctx, req, metrics)
}

// Stop ends the engine's whole process group and proves it gone.
func (d *Driver) Stop(_ context.Context, req *sdk.StopRequest) (*sdk.StopResponse, error) {
	return d.reg.Stop(req, stopGrace, enginekit.StopHooks{})
}

// Recover re-attaches a restarted driver to an engine that kept running.
func (d *Driver) Recover(_ context.Context, req *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	return d.reg.Recover(req, func(l proc.Launched, detail string) (*enginekit.Instance, string, error) {
		launch := &req.Launch
		served := req.Deployment.ServedName
		return instance(req.InstanceID, launch.LaunchID, l, int(launch.Port), served, req.EngineKey), detail, nil
	})
}

// Logs returns the redacted tail of the engine's output.
func (d *Driver) Logs(_ context.Context, req *sdk.LogsRequest) (*sdk.LogsResponse, error) {
	return d.reg.Logs(req)
}
