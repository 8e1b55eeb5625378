// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package custom

import (
	"context"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// Plan implements sdk.Driver: it validates the deployment against the
// manifest and renders argv and env (no secrets).
func (d *Driver) Plan(_ context.Context, req *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	inst, dep, host, lctx := &req.Installation, &req.Deployment, &req.Host, &req.Launch
	m, err := manifestFromDetails(inst.Details)
	if err != nil {
		return nil, err
	}
	resp := &sdk.PlanResponse{Residency: enginekit.ResidencyRestartOnly, StartupTimeout: m.startupTimeout()}
	var r enginekit.Refusals
	// A custom engine declares no multi-node launch: Capabilities.groups
	// is false.
	enginekit.RefuseGroup(dep, Family, "a custom engine ("+inst.Name+")", &r)
	if dep.API != "" && dep.API != m.API {
		r.Add("capability_missing:"+dep.API, "api", "engine %s serves the %s API, not %s", inst.Name, m.API, dep.API)
	}
	switch dep.Residency {
	case "", enginekit.ResidencyRestartOnly:
	case enginekit.ResidencyDeep, enginekit.ResidencyHostBacked:
		r.Add("capability_missing:deep_park", "residency", "custom engines do not park: remove residency or set restart_only")
	default:
		r.Add("invalid_config", "residency", "unknown residency %q", dep.Residency)
	}
	if len(dep.ExtraArgs) > 0 && !dep.AcceptExtraArgs {
		r.Add("extra_args_not_accepted", "engine_config.extra_args", "extra_args need engine_config.accept_extra_args = true")
	}
	for _, a := range dep.ExtraArgs {
		if strings.Contains(a, "{{") {
			r.Add("invalid_config", "engine_config.extra_args", "extra_args may not use placeholders (%q)", a)
		}
	}
	for _, name := range sortedKeys(dep.Env) {
		if reservedEnv(name, m.KeyEnv) {
			r.Add("engine_env_reserved:"+name, "engine_config.env", "%s is owned by CapyCTL", name)
			continue
		}
		if !globMatch(host.ApprovedEnv, name) {
			r.Add("engine_env_not_approved:"+name, "engine_config.env",
				"%s is not approved for engine %s (capyctl engine add ... --approve-env %s)", name, inst.Name, name)
		}
	}
	if dep.TrustRemoteCode {
		r.Add("remote_code_not_allowed", "engine_config.trust_remote_code", "custom engines have no trust_remote_code; configure the program itself")
	}
	if len(r) > 0 {
		resp.Refusals = r
		return resp, nil
	}

	port := "{{port}}"
	if lctx.Port > 0 {
		port = strconv.Itoa(int(lctx.Port))
	}
	repl := strings.NewReplacer(
		"{{host}}", "127.0.0.1",
		"{{port}}", port,
		"{{served_name}}", dep.ServedName,
		"{{model_dir}}", dep.ModelDir,
		"{{launch_dir}}", lctx.LaunchDir,
	)
	argv := []string{inst.Path}
	for _, a := range m.Args {
		argv = append(argv, repl.Replace(a))
	}
	argv = append(argv, dep.ExtraArgs...)
	env := enginekit.NewEnv(enginekit.SystemPath)
	if lctx.LaunchDir != "" {
		env["HOME"] = lctx.LaunchDir
	}
	env.NoTelemetry(host)
	env.Merge(host.HostEnv)
	for k, v := range m.Env {
		if !strings.Contains(v, "{{engine_key}}") {
			env[k] = repl.Replace(v)
		}
	}
	env.Merge(dep.Env)
	resp.Argv = argv
	resp.Env = env
	resp.Workdir = lctx.LaunchDir
	resp.Hints = sdk.MemoryHints{Source: "declared"}
	if r := &dep.Resources; r.Declared {
		resp.Hints.ReadyDeviceBytes = r.DeviceBytes
		resp.Hints.ReadyHostBytes = r.HostBytes
		resp.Hints.StartupDeviceBytes = r.DeviceBytes
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

// Start implements sdk.Driver: the registered program must be what runs;
// the key reaches it through the manifest's key_env and env values.
func (d *Driver) Start(_ context.Context, req *sdk.StartRequest) (*sdk.StartResponse, error) {
	inst, dep, lctx := &req.Installation, &req.Deployment, &req.Launch
	m, err := manifestFromDetails(inst.Details)
	if err != nil {
		return nil, err
	}
	// IMPORTANT: the pinned installation must be what runs.
	digest, err := enginekit.FileDigest(inst.Path)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "program %s: %v", inst.Path, err)
	}
	if inst.Digest != "" && digest != inst.Digest {
		return nil, sdk.Errorf(enginekit.CodeInstallationDrift,
			"program %s changed since it was registered (pinned %s, now %s); register it again with capyctl engine add --custom", inst.Path, inst.Digest, digest)
	}
	launched, err := enginekit.StartLaunch(enginekit.LaunchOptions{
		Plan: &req.Plan, Host: &req.Host, Launch: lctx, SecretEnv: secretEnv(m, req.EngineKey),
		Secrets: []string{req.EngineKey, req.AdminKey}, Program: path.Base(inst.Path),
	})
	if err != nil {
		return nil, err
	}
	h := newHandle(lctx.InstanceID, lctx.LaunchID, *launched, int(lctx.Port), req.EngineKey, m, dep, d.stopGrace)
	return d.reg.Started(h), nil
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

// sortedKeys returns a map's keys in order, so refusals come out the same
// way every time.
func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
