// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package custom

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// closedPath is the PATH every custom engine gets.
const closedPath = "/usr/local/bin:/usr/bin:/bin"

// Plan implements sdk.Driver: it validates the deployment against the
// manifest and renders argv and env (no secrets).
func (d *Driver) Plan(_ context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	inst, dep, host, lctx := req.GetInstallation(), req.GetDeployment(), req.GetHost(), req.GetLaunch()
	m, err := manifestFromDetails(inst.GetDetails())
	if err != nil {
		return nil, err
	}
	resp := &pb.PlanResponse{Residency: "restart_only", StartupTimeoutMs: m.startupTimeout().Milliseconds()}
	refuse := func(code, field, format string, args ...any) {
		resp.Refusals = append(resp.Refusals, &pb.Refusal{Code: code, Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if dep.GetApi() != "" && dep.GetApi() != m.API {
		refuse("capability_missing:"+dep.GetApi(), "api", "engine %s serves the %s API, not %s", inst.GetName(), m.API, dep.GetApi())
	}
	switch dep.GetResidency() {
	case "", "restart_only":
	case "deep", "host_backed":
		refuse("capability_missing:deep_park", "residency", "custom engines do not park: remove residency or set restart_only")
	default:
		refuse("invalid_config", "residency", "unknown residency %q", dep.GetResidency())
	}
	if len(dep.GetExtraArgs()) > 0 && !dep.GetAcceptExtraArgs() {
		refuse("extra_args_not_accepted", "engine_config.extra_args", "extra_args need engine_config.accept_extra_args = true")
	}
	for _, a := range dep.GetExtraArgs() {
		if strings.Contains(a, "{{") {
			refuse("invalid_config", "engine_config.extra_args", "extra_args may not use placeholders (%q)", a)
		}
	}
	for name := range dep.GetEnv() {
		if reservedEnv(name, m.KeyEnv) {
			refuse("engine_env_reserved:"+name, "engine_config.env", "%s is owned by CapyCTL", name)
			continue
		}
		if !globMatch(host.GetApprovedEnv(), name) {
			refuse("engine_env_not_approved:"+name, "engine_config.env",
				"%s is not approved for engine %s (capyctl engine add ... --approve-env %s)", name, inst.GetName(), name)
		}
	}
	if dep.GetTrustRemoteCode() {
		refuse("remote_code_not_allowed", "engine_config.trust_remote_code", "custom engines have no trust_remote_code; configure the program itself")
	}
	if len(resp.Refusals) > 0 {
		return resp, nil
	}

	port := "{{port}}"
	if lctx.GetPort() > 0 {
		port = strconv.Itoa(int(lctx.GetPort()))
	}
	repl := strings.NewReplacer(
		"{{host}}", "127.0.0.1",
		"{{port}}", port,
		"{{served_name}}", dep.GetServedName(),
		"{{model_dir}}", dep.GetModelDir(),
		"{{launch_dir}}", lctx.GetLaunchDir(),
	)
	argv := []string{inst.GetPath()}
	for _, a := range m.Args {
		argv = append(argv, repl.Replace(a))
	}
	argv = append(argv, dep.GetExtraArgs()...)
	env := map[string]string{
		"PATH": closedPath,
		"LANG": "C.UTF-8",
	}
	if lctx.GetLaunchDir() != "" {
		env["HOME"] = lctx.GetLaunchDir()
	}
	if host.GetEngineTelemetry() != "allow" {
		env["DO_NOT_TRACK"] = "1"
	}
	for k, v := range host.GetHostEnv() {
		env[k] = v
	}
	for k, v := range m.Env {
		if !strings.Contains(v, "{{engine_key}}") {
			env[k] = repl.Replace(v)
		}
	}
	for k, v := range dep.GetEnv() {
		env[k] = v
	}
	resp.Argv = argv
	resp.Env = env
	resp.Workdir = lctx.GetLaunchDir()
	resp.Hints = &pb.MemoryHints{Source: "declared"}
	if r := dep.GetResources(); r.GetDeclared() {
		resp.Hints.ReadyDeviceBytes = r.GetDeviceBytes()
		resp.Hints.ReadyHostBytes = r.GetHostBytes()
		resp.Hints.StartupDeviceBytes = r.GetDeviceBytes()
	}
	resp.Notes = []string{"restart only: parking stops the engine"}
	return resp, nil
}

// secretEnv returns the env entries that carry the launch's key.
func secretEnv(m *Manifest, key string) map[string]string {
	out := map[string]string{}
	if m.KeyEnv != "" && key != "" {
		out[m.KeyEnv] = key
	}
	for k, v := range m.Env {
		if strings.Contains(v, "{{engine_key}}") {
			out[k] = strings.ReplaceAll(v, "{{engine_key}}", key)
		}
	}
	return out
}

// Start implements sdk.Driver.
func (d *Driver) Start(_ context.Context, req *pb.StartRequest) (*pb.StartResponse, error) {
	inst, dep, host, lctx, plan := req.GetInstallation(), req.GetDeployment(), req.GetHost(), req.GetLaunch(), req.GetPlan()
	m, err := manifestFromDetails(inst.GetDetails())
	if err != nil {
		return nil, err
	}
	if lctx.GetPort() <= 0 || lctx.GetLaunchDir() == "" {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "start needs a leased port and a launch directory")
	}
	// IMPORTANT: the pinned installation must be what runs.
	digest, err := fileDigest(inst.GetPath())
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "program %s: %v", inst.GetPath(), err)
	}
	if inst.GetDigest() != "" && digest != inst.GetDigest() {
		return nil, sdk.Errorf("installation_drift",
			"program %s changed since it was registered (pinned %s, now %s); register it again with capyctl engine add --custom", inst.GetPath(), inst.GetDigest(), digest)
	}
	if !proc.PortFree(int(lctx.GetPort())) {
		return nil, sdk.Errorf("port_conflict", "another process listens on the leased port %d", lctx.GetPort())
	}
	env := map[string]string{}
	for k, v := range plan.GetEnv() {
		env[k] = v
	}
	secrets := []string{req.GetEngineKey(), req.GetAdminKey()}
	for k, v := range secretEnv(m, req.GetEngineKey()) {
		env[k] = v
	}
	logMode := proc.LogModeFile
	if host.GetEngineLogs() == "memory" || host.GetRetention() == "zero" {
		logMode = proc.LogModeMemory
	}
	launched, err := proc.Start(proc.LaunchSpec{
		Argv:        plan.GetArgv(),
		Env:         env,
		Dir:         plan.GetWorkdir(),
		LaunchDir:   lctx.GetLaunchDir(),
		LogMode:     logMode,
		Secrets:     nonEmpty(secrets),
		NoCoreDumps: host.GetRetention() == "zero",
	})
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "launch %s: %v", path.Base(inst.GetPath()), err)
	}
	h := &handle{
		id: lctx.GetInstanceId(), launched: *launched, port: int(lctx.GetPort()), key: req.GetEngineKey(),
		manifest: m, servedName: dep.GetServedName(), api: dep.GetApi(), stopGrace: m.stopGrace(d.stopGrace),
	}
	d.put(h)
	return &pb.StartResponse{Launch: h.launchPB(lctx.GetLaunchId()), Endpoint: h.endpoint()}, nil
}

func nonEmpty(xs []string) []string {
	var out []string
	for _, x := range xs {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}

// globMatch reports whether name matches one of the glob patterns.
func globMatch(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var _ = sortedKeys
