// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package tensorfold

import (
	"context"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/flags"
	"github.com/capyctl/capyctl/sdk/formats"
	"github.com/capyctl/capyctl/sdk/proc"
)

// DefaultParallel is --parallel when max_concurrent_requests is unset.
const DefaultParallel = 8

// StartupTimeout bounds a start: the first request builds CUDA kernels.
const StartupTimeout = 30 * time.Minute

// memoryLimitEnv is TensorFold's memory cap, in GiB.
const memoryLimitEnv = "TENSORFOLD_CUDA_MEMORY_LIMIT_GB"

// configKeys are the keys of engine_config.tensorfold.
var configKeys = []pyengine.Key{
	{Name: "max_tokens", Type: "int", Min: 1, Doc: "the longest answer (--max-tokens)"},
	{Name: "thinking", Type: "bool", Doc: "reasoning on or off (--thinking, --no-thinking)"},
}

// Plan implements sdk.Driver: it checks the deployment (resources and
// context_length stated, restart only, chat) and renders `tensorfold
// serve` with its cap at the ready allocation.
func (d *Driver) Plan(_ context.Context, req *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	inst, dep, host, lctx := &req.Installation, &req.Deployment, &req.Host, &req.Launch
	resp := &sdk.PlanResponse{Residency: enginekit.ResidencyRestartOnly, StartupTimeout: StartupTimeout}
	var r enginekit.Refusals
	cfg := pyengine.DecodeFamily(dep.EngineConfigJSON, Family, configKeys, &r)
	typed := pyengine.TypedFields(dep, map[string]bool{
		"engine_config.tensorfold.max_tokens": cfg.Has("max_tokens"),
		"engine_config.tensorfold.thinking":   cfg.Has("thinking"),
	})
	pyengine.Common(Table, dep, host, typed, &r)
	switch dep.Residency {
	case enginekit.ResidencyDeep, enginekit.ResidencyHostBacked:
		r.Add(enginekit.CodeCapabilityMissing+":deep_park", "residency", "TensorFold cannot park: remove residency or set restart_only (CapyCTL stops it when it needs the memory)")
	}
	if dep.API != "" && dep.API != "chat" {
		r.Add(enginekit.CodeCapabilityMissing+":"+dep.API, "api", "TensorFold serves chat only")
	}
	if dep.TrustRemoteCode {
		r.Add(flags.CodeRemoteCode, "engine_config.trust_remote_code", "TensorFold runs no code from a checkpoint: remove trust_remote_code")
	}
	for _, f := range []struct{ field, v string }{{"engine_config.dtype", dep.Dtype}, {"engine_config.quantization", dep.Quantization}, {"engine_config.cuda_graphs", dep.CUDAGraphs}} {
		if f.v != "" {
			r.Add(flags.CodeInvalidConfig, f.field, "TensorFold has no such setting: remove %s", f.field)
		}
	}
	res := &dep.Resources
	if !res.Declared || res.DeviceBytes <= 0 {
		r.Add(flags.CodeInvalidConfig, "resources", "a TensorFold deployment states its memory: resources { gpu = \"...\" ram = \"...\" } (TensorFold is capped at its ready allocation)")
	}
	if dep.ContextLength <= 0 {
		r.Add(flags.CodeInvalidConfig, "engine_config.context_length", "a TensorFold deployment states its context_length (the longest request)")
	}
	capBytes := res.DeviceBytes
	if lctx.DeviceBytes > 0 {
		capBytes = lctx.DeviceBytes
	}
	group := dep.Group
	if group != nil && (group.Size != 2 || group.TensorParallel != 2 || group.PipelineParallel != 1) {
		r.Add(enginekit.CodeGroupShapeUnsupported+":"+Family, "topology",
			"TensorFold runs tensor parallel on exactly two machines: topology { tensor_parallel = 2, pipeline_parallel = 1 } with two placement.hosts (got tensor_parallel %d, pipeline_parallel %d on %d machines)",
			group.TensorParallel, group.PipelineParallel, group.Size)
	} else {
		enginekit.CheckGroup(group, enginekit.GroupOptions{RDMADir: d.rdmaDir}, &r)
	}
	// A rank of a pair holds half the weights.
	weights := enginekit.GroupShare(weightsBytes(dep.ModelDir), group)
	if capBytes > 0 && weights >= capBytes {
		r.Add(flags.CodeInvalidConfig, "resources", "TensorFold's memory cap (%s) cannot hold the weights (%s) beside its KV cache: raise resources.gpu", gib(capBytes), gib(weights))
	}
	if len(r) > 0 {
		resp.Refusals = r
		return resp, nil
	}
	parallel := pyengine.MaxConcurrent(dep, DefaultParallel)
	resp.Hints = sdk.MemoryHints{
		WeightsBytes: weights, ContextLength: dep.ContextLength, MaxConcurrentRequests: int32(parallel), Source: enginekit.GroupSource("declared", group),
		ReadyDeviceBytes: res.DeviceBytes, ReadyHostBytes: res.HostBytes,
	}
	venv := inst.Details[detailVenv]
	if venv == "" {
		venv = inst.Path
	}
	resp.Argv = renderArgv(venv, dep, lctx, cfg, parallel)
	resp.Env = d.renderEnv(venv, inst, dep, host, lctx, capBytes)
	pyengine.GroupEnv(resp.Env, group)
	resp.Workdir = lctx.LaunchDir
	resp.Notes = []string{"restart only: TensorFold cannot park; CapyCTL stops it when it needs the memory",
		"the first request builds CUDA kernels; readiness waits for it within the startup budget"}
	if group != nil {
		resp.Notes = append(resp.Notes, enginekit.GroupNote(group))
	}
	if enginekit.GroupWorker(group) {
		resp.Notes = append(resp.Notes, "rank 1 of the pair serves no HTTP: readiness is its process running")
	}
	return resp, nil
}

// weightsBytes is the checkpoint's safetensors weights (headers read), or
// its weight files' sizes.
func weightsBytes(dir string) int64 {
	if dir == "" {
		return 0
	}
	if m, err := formats.ReadSafetensorsDir(dir); err == nil {
		return int64(m.WeightsBytes())
	}
	return pyengine.WeightsBytes(dir)
}

// gib renders bytes as the cap TensorFold reads: GiB, floored to two
// decimals so the cap never exceeds the allocation.
func gib(b int64) string {
	return strconv.FormatFloat(math.Floor(float64(b)*100/(1<<30))/100, 'f', -1, 64)
}

// renderArgv is `tensorfold serve <model dir> ...`.
func renderArgv(venv string, dep *sdk.Deployment, lctx *sdk.LaunchContext, cfg pyengine.FamilyConfig, parallel int) []string {
	port := "{{port}}"
	if lctx.Port > 0 {
		port = strconv.Itoa(int(lctx.Port))
	}
	model := dep.ModelDir
	if model == "" {
		model = "{{model_dir}}"
	}
	argv := []string{
		filepath.Join(venv, "bin", "tensorfold"), "serve", model,
		"--name", dep.ServedName,
		"--host", "127.0.0.1",
		"--port", port,
		"--no-update-check",
		"--backend", "cuda",
		"--snapshot-dir", "none",
		"--context", strconv.FormatInt(dep.ContextLength, 10),
		"--parallel", strconv.Itoa(parallel),
	}
	if g := dep.Group; g != nil {
		// TensorFold's two-machine tensor parallel (shared/reference/
		// original.md, ADR 0028: "TensorFold --tp 2 --rank r --master
		// --master-port"): the pair's size, this rank, and the head's
		// address and rendezvous port on both.
		argv = append(argv, "--tp", "2", "--rank", strconv.Itoa(int(g.Rank)),
			"--master", g.HeadAddress, "--master-port", strconv.Itoa(int(g.RendezvousPort)))
	}
	if t := dep.KVCacheDtype; t != "" {
		argv = append(argv, "--kv-dtype", t)
	}
	if n, ok := cfg.Int("max_tokens"); ok {
		argv = append(argv, "--max-tokens", strconv.FormatInt(n, 10))
	}
	if cfg.Has("thinking") {
		if string(cfg["thinking"]) == "true" {
			argv = append(argv, "--thinking")
		} else {
			argv = append(argv, "--no-thinking")
		}
	}
	return append(argv, dep.ExtraArgs...)
}

// renderEnv is the engine's environment: the Python engines' base, the
// build tools on PATH, nothing fetched, the kernels kept between starts,
// and the memory cap.
func (d *Driver) renderEnv(venv string, inst *sdk.Installation, dep *sdk.Deployment, host *sdk.HostPolicy, lctx *sdk.LaunchContext, capBytes int64) map[string]string {
	env := pyengine.BaseEnv(pyengine.EnvOptions{Venv: venv, Host: host, Launch: lctx})
	cuda := host.CUDAHome
	if cuda == "" {
		cuda = inst.Details[detailCUDAHome]
	}
	var tools []string
	if t := inst.Details[detailToolDirs]; t != "" {
		tools = strings.Split(t, ":")
	}
	env["PATH"] = d.enginePath(venv, tools, cuda)
	if cuda != "" {
		env["CUDA_HOME"] = cuda
	}
	env["TENSORFOLD_NO_UPDATE_CHECK"] = "1"
	env["TRANSFORMERS_OFFLINE"] = "1"
	env["TORCH_EXTENSIONS_DIR"] = extensionsDir(lctx.LaunchDir, inst.Digest)
	env[memoryLimitEnv] = gib(capBytes)
	env.Merge(dep.Env)
	return env
}

// extensionsDir keeps the kernels TensorFold builds between starts of the
// same installation: <state_dir>/engines/tensorfold/<digest>/torch_extensions
// beside the launches, else in the launch directory.
func extensionsDir(launchDir, digest string) string {
	if launchDir == "" {
		return "{{launch_dir}}/torch_extensions"
	}
	id := strings.TrimPrefix(digest, "sha256:")
	if len(id) > 16 {
		id = id[:16]
	}
	if i := strings.LastIndex(launchDir, "/launches/"); i >= 0 && id != "" {
		return filepath.Join(launchDir[:i], "engines", Family, id, "torch_extensions")
	}
	return filepath.Join(launchDir, "torch_extensions")
}

// Start implements sdk.Driver: the pinned installation must be what runs;
// TensorFold gets no key (a key would lock CapyCTL out of /health).
func (d *Driver) Start(_ context.Context, req *sdk.StartRequest) (*sdk.StartResponse, error) {
	inst, dep, lctx := &req.Installation, &req.Deployment, &req.Launch
	if _, err := pyengine.CheckPinned(inst.Path, inst.Digest); err != nil {
		return nil, err
	}
	launched, err := enginekit.StartLaunch(enginekit.LaunchOptions{Plan: &req.Plan, Host: &req.Host, Launch: lctx,
		Secrets: []string{req.EngineKey, req.AdminKey}})
	if err != nil {
		return nil, err
	}
	return d.reg.Started(instance(lctx.InstanceID, lctx.LaunchID, *launched, int(lctx.Port), dep)), nil
}

// instance builds the driver's handle of a launch. The router reaches
// TensorFold without a key (chat only).
func instance(id, launchID string, l proc.Launched, port int, dep *sdk.Deployment) *enginekit.Instance {
	in := enginekit.NewInstance(id, launchID, l, port, enginekit.NewEndpoint(port, dep.ServedName, ""))
	in.API, in.ModelDir, in.Residency = dep.API, dep.ModelDir, enginekit.ResidencyRestartOnly
	in.Group = dep.Group
	return in
}
