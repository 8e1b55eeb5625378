// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"context"
	"strconv"

	"github.com/capyctl/capyctl/drivers/internal/engine"
	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/formats"
	"github.com/capyctl/capyctl/sdk/proc"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// residency is the effective residency: the deployment's, deep by default.
func residency(dep *pb.Deployment) string {
	if r := dep.GetResidency(); r != "" {
		return r
	}
	return engine.ResidencyDeep
}

// Plan implements sdk.Driver: it checks the deployment (refusals with
// codes) and renders the launch.
func (d *Driver) Plan(_ context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	inst, dep, host, lctx := req.GetInstallation(), req.GetDeployment(), req.GetHost(), req.GetLaunch()
	var r engine.Refusals
	if api := dep.GetApi(); api != "" && api != "chat" {
		r.Add(engine.CodeCapabilityMissing+":"+api, "api",
			"vLLM answers decision models from their text output instead of their decision head: deploy api = %q on SGLang 0.5.22 or llama.cpp 0.7.0", api)
	}
	cfg := pyengine.DecodeFamily(dep.GetEngineConfigJson(), Family, configKeys, &r)
	declared := func(k string) bool { s := cfg.String(k); return s != "" && s != "auto" }
	typed := pyengine.TypedFields(dep, map[string]bool{
		"engine_config.vllm.block_size_tokens":      cfg.Has("block_size_tokens"),
		"engine_config.vllm.max_num_batched_tokens": cfg.Has("max_num_batched_tokens"),
		"engine_config.vllm.tool_call_parser":       declared("tool_call_parser"),
		"engine_config.vllm.reasoning_parser":       declared("reasoning_parser"),
	})
	args := pyengine.Common(Table, dep, host, typed, &r)
	venv, err := pyengine.FindVenv(inst.GetPath())
	if err != nil {
		r.Add(sdk.CodeEngineNotFound, "engine", "engine %s: %v", inst.GetName(), err)
	}
	if len(r) > 0 {
		return &pb.PlanResponse{Refusals: r}, nil
	}

	res := residency(dep)
	weights := pyengine.WeightsBytes(dep.GetModelDir())
	hf, _ := formats.ReadHFConfig(dep.GetModelDir())
	kvPerToken := hf.KVBytesPerToken(1, dep.GetKvCacheDtype())
	kvBudget := lctx.GetKvCacheBytes()
	if kvBudget <= 0 {
		kvBudget = dep.GetMemory().GetKvCacheBytes()
	}
	contextLen := dep.GetContextLength()
	fitted := false
	if contextLen <= 0 && hf != nil && kvPerToken > 0 && kvBudget > 0 {
		// A context the KV budget cannot hold once makes vLLM refuse to
		// start: fit it, in 16-token blocks.
		if fit := kvBudget / kvPerToken / 16 * 16; fit > 0 && fit < hf.MaxPositionEmbeddings {
			contextLen, fitted = fit, true
		}
	}
	parsers := pyengine.ChooseParsers(pyengine.ParserInput{
		ModelDir: dep.GetModelDir(), API: dep.GetApi(), Tool: cfg.String("tool_call_parser"), Reasoning: cfg.String("reasoning_parser"),
		Args: args, ToolOption: "--tool-call-parser", ReasoningOption: "--reasoning-parser",
	}, parserNames)

	argv := []string{venv.Python, "-m", Module,
		"--model", dep.GetModelDir(),
		"--served-model-name", dep.GetServedName(),
		"--host", "127.0.0.1",
	}
	if p := lctx.GetPort(); p > 0 {
		argv = append(argv, "--port", strconv.Itoa(int(p)))
	}
	maxSeqs := pyengine.MaxConcurrent(dep, pyengine.DefaultMaxConcurrent)
	argv = append(argv, "--max-num-seqs", strconv.Itoa(maxSeqs))
	if contextLen > 0 {
		argv = append(argv, "--max-model-len", strconv.FormatInt(contextLen, 10))
	}
	for _, o := range []struct{ flag, val string }{
		{"--dtype", dep.GetDtype()}, {"--quantization", dep.GetQuantization()}, {"--kv-cache-dtype", dep.GetKvCacheDtype()},
	} {
		if o.val != "" {
			argv = append(argv, o.flag, o.val)
		}
	}
	if dep.GetCudaGraphs() == "false" {
		argv = append(argv, "--enforce-eager")
	}
	if n, ok := cfg.Int("block_size_tokens"); ok {
		argv = append(argv, "--block-size", strconv.FormatInt(n, 10))
	}
	if n, ok := cfg.Int("max_num_batched_tokens"); ok {
		argv = append(argv, "--max-num-batched-tokens", strconv.FormatInt(n, 10))
	}
	if f := pyengine.Fraction(lctx.GetDeviceBytes(), lctx.GetDeviceTotalBytes()); f != "" {
		argv = append(argv, "--gpu-memory-utilization", f)
	}
	if kvBudget > 0 {
		argv = append(argv, "--kv-cache-memory-bytes", strconv.FormatInt(kvBudget, 10))
	}
	if engine.Parks(res) {
		argv = append(argv, "--enable-sleep-mode")
	}
	if s := cfg.String("safetensors_load_strategy"); s != "" {
		argv = append(argv, "--safetensors-load-strategy", s)
	} else if engine.Parks(res) {
		// A deep wake under lazy loading reloads far slower.
		argv = append(argv, "--safetensors-load-strategy", "eager")
	}
	// IMPORTANT: prompts and answers never reach a log.
	argv = append(argv, "--no-enable-log-requests", "--no-enable-log-outputs")
	if dep.GetTrustRemoteCode() {
		argv = append(argv, "--trust-remote-code")
	}
	if parsers.Tool != "" {
		argv = append(argv, "--tool-call-parser", parsers.Tool, "--enable-auto-tool-choice")
	}
	if parsers.Reasoning != "" {
		argv = append(argv, "--reasoning-parser", parsers.Reasoning)
	}
	argv = append(argv, dep.GetExtraArgs()...)

	env := pyengine.BaseEnv(pyengine.EnvOptions{Venv: venv.Dir, Host: host, Launch: lctx})
	if engine.TelemetryOff(host) {
		env["VLLM_DO_NOT_TRACK"] = "1"
		env["VLLM_NO_USAGE_STATS"] = "1"
	}
	if engine.Parks(res) {
		// vLLM parses it with int(): "1", never "true".
		env["VLLM_SERVER_DEV_MODE"] = "1"
	}
	env.Merge(dep.GetEnv())

	hints := &pb.MemoryHints{
		WeightsBytes:          weights,
		KvBytesPerToken:       kvPerToken,
		KvCacheBytes:          kvBudget,
		ContextLength:         contextLen,
		MaxConcurrentRequests: int32(maxSeqs),
		Source:                "safetensors+config.json",
	}
	if contextLen <= 0 && hf != nil {
		hints.ContextLength = hf.MaxPositionEmbeddings
	}
	resp := &pb.PlanResponse{
		Argv:             argv,
		Env:              env,
		Workdir:          lctx.GetLaunchDir(),
		Hints:            hints,
		Parsers:          parsers.Report,
		Residency:        res,
		StartupTimeoutMs: pyengine.StartupTimeout(weights).Milliseconds(),
		WakeTimeoutMs:    pyengine.WakeTimeout(weights, res).Milliseconds(),
	}
	if engine.Parks(res) {
		resp.Notes = append(resp.Notes, "parks with vLLM's sleep mode: its development routes (/sleep, /wake_up) are on, on loopback only")
	}
	if fitted {
		resp.Notes = append(resp.Notes, "context fitted to the KV budget: --max-model-len "+strconv.FormatInt(contextLen, 10))
	}
	return resp, nil
}

// endpoint is how the router reaches an instance: the request ID in
// X-Request-Id.
func endpoint(port int, key, served string) *pb.Endpoint {
	ep := engine.NewEndpoint(port, served, key)
	ep.RequestIdHeader = "X-Request-Id"
	return ep
}

// Start implements sdk.Driver: the pinned installation must be what runs;
// the key reaches vLLM through VLLM_API_KEY.
func (d *Driver) Start(_ context.Context, req *pb.StartRequest) (*pb.StartResponse, error) {
	inst, dep, lctx := req.GetInstallation(), req.GetDeployment(), req.GetLaunch()
	if _, err := pyengine.CheckPinned(inst.GetPath(), inst.GetDigest()); err != nil {
		return nil, err
	}
	secretEnv := map[string]string{}
	if k := req.GetEngineKey(); k != "" {
		secretEnv["VLLM_API_KEY"] = k
	}
	launched, err := engine.StartLaunch(engine.LaunchOptions{
		Plan: req.GetPlan(), Host: req.GetHost(), Launch: lctx, SecretEnv: secretEnv,
		Secrets: []string{req.GetEngineKey(), req.GetAdminKey()},
	})
	if err != nil {
		return nil, err
	}
	in := d.instance(lctx.GetInstanceId(), lctx.GetLaunchId(), *launched, int(lctx.GetPort()), req.GetEngineKey(), dep)
	if r := req.GetPlan().GetResidency(); r != "" {
		in.Residency = r
	}
	return d.reg.Started(in), nil
}

// instance builds the driver's handle of a launch.
func (d *Driver) instance(id, launchID string, l proc.Launched, port int, key string, dep *pb.Deployment) *engine.Instance {
	in := engine.NewInstance(id, launchID, l, port, endpoint(port, key, dep.GetServedName()))
	in.API = "chat"
	in.Residency = residency(dep)
	in.ModelDir = dep.GetModelDir()
	return in
}
