// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/flags"
)

// Startup bounds: llama.cpp loads by mmap, so a start takes about the time
// to read the weights once.
const (
	startupBase  = 120 * time.Second
	startupPerGB = 10 * time.Second
	startupMax   = 30 * time.Minute
)

// configSchema names the keys of engine_config.llamacpp.
const configSchema = `{"llamacpp":{"gguf_file":"string","n_gpu_layers":"int|\"all\"","mmproj_file":"string"}}`

// Config is engine_config.llamacpp.
type Config struct {
	// GGUFFile is the model file in the model directory ("" when it holds
	// one).
	GGUFFile string
	// GPULayers is n_gpu_layers; -1 is "all" (the default).
	GPULayers int64
	// MMProjFile is a multimodal projector in the model directory.
	MMProjFile string
}

// decodeConfig reads engine_config.llamacpp; unknown keys and bad values
// are refused.
func decodeConfig(raw []byte, r *enginekit.Refusals) Config {
	c := Config{GPULayers: -1}
	if len(raw) == 0 {
		return c
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		r.Add(flags.CodeInvalidConfig, "engine_config.llamacpp", "not an object: %v", err)
		return c
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := obj[k]
		field := "engine_config.llamacpp." + k
		switch k {
		case "gguf_file", "mmproj_file":
			var s string
			if json.Unmarshal(v, &s) != nil || s == "" {
				r.Add(flags.CodeInvalidConfig, field, "must be a file name in the model directory")
				continue
			}
			if k == "gguf_file" {
				c.GGUFFile = s
			} else {
				c.MMProjFile = s
			}
		case "n_gpu_layers":
			var s string
			if json.Unmarshal(v, &s) == nil {
				if s == "all" {
					continue
				}
				if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
					c.GPULayers = n
					continue
				}
				r.Add(flags.CodeInvalidConfig, field, `must be a number of layers or "all", not %q`, s)
				continue
			}
			var n float64
			if json.Unmarshal(v, &n) != nil || n < 0 || n != float64(int64(n)) {
				r.Add(flags.CodeInvalidConfig, field, `must be a number of layers or "all"`)
				continue
			}
			c.GPULayers = int64(n)
		default:
			r.Add(enginekit.CodeUnknownConfigKey+":"+k, field, "llama.cpp takes gguf_file, n_gpu_layers and mmproj_file")
		}
	}
	return c
}

// Plan implements sdk.Driver: it checks the deployment, sizes it from the
// GGUF header, and renders llama-server's command line and environment.
func (d *Driver) Plan(_ context.Context, req *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	inst, dep, host, lctx := &req.Installation, &req.Deployment, &req.Host, &req.Launch
	resp := &sdk.PlanResponse{Residency: enginekit.ResidencyRestartOnly}
	var r enginekit.Refusals
	// llama.cpp runs a model on one machine (its RPC backend is not a
	// group CapyCTL runs): Capabilities.groups is false.
	enginekit.RefuseGroup(dep, Family, "llama.cpp", &r)
	cfg := decodeConfig(dep.EngineConfigJSON, &r)

	switch dep.API {
	case "", "chat", "embeddings", "rerank":
	case "decisions":
		if !versionAtLeast(inst.Version, DecisionsMinVersion) {
			r.Add(enginekit.CodeCapabilityMissing+":decisions", "api", "decision models need llama.cpp %s or newer; engine %s is %s", DecisionsMinVersion, inst.Name, inst.Version)
		}
	default:
		r.Add(enginekit.CodeCapabilityMissing+":"+dep.API, "api", "llama.cpp serves chat, decisions, embeddings and rerank, not %q", dep.API)
	}
	switch dep.Residency {
	case "", enginekit.ResidencyRestartOnly:
	case enginekit.ResidencyDeep, enginekit.ResidencyHostBacked:
		r.Add(enginekit.CodeCapabilityMissing+":deep_park", "residency", "llama.cpp cannot park: remove residency or set restart_only (CapyCTL stops the model when it needs the memory)")
	default:
		r.Add(flags.CodeInvalidConfig, "residency", "unknown residency %q", dep.Residency)
	}
	if dep.TrustRemoteCode {
		r.Add(flags.CodeRemoteCode, "engine_config.trust_remote_code", "llama.cpp runs no code from a checkpoint: remove trust_remote_code")
	}
	for _, f := range []struct{ field, v string }{
		{"engine_config.dtype", dep.Dtype}, {"engine_config.quantization", dep.Quantization}, {"engine_config.cuda_graphs", dep.CUDAGraphs},
	} {
		if f.v != "" {
			r.Add(flags.CodeInvalidConfig, f.field, "llama.cpp runs the GGUF file's own types and has no such setting: remove %s", f.field)
		}
	}
	if m := &dep.Memory; m.KVCacheBytes > 0 {
		r.Add(flags.CodeInvalidConfig, "engine_config.memory.kv_cache", "llama.cpp's KV cache is a full window per slot: set context_length and max_concurrent_requests instead")
	}
	if n := dep.MaxConcurrentRequests; n < 0 || n > 256 {
		r.Add(flags.CodeInvalidConfig, "engine_config.max_concurrent_requests", "llama.cpp runs 1 to 256 slots, not %d", n)
	}
	enginekit.CheckOptions(Table, dep, host, nil, &r)
	if d.systemConfig != "" {
		if _, err := os.Stat(d.systemConfig); err == nil {
			r.Add(enginekit.CodeEngineUnsupported, "engine", "llama-server would read %s, a configuration CapyCTL does not control: remove it from this host", d.systemConfig)
		}
	}

	// The memory, from the header (when the model directory is known).
	var sz *Sizing
	if dir := dep.ModelDir; dir != "" && len(r) == 0 {
		var err error
		sz, err = Size(SizeInput{
			Dir: dir, File: cfg.GGUFFile, Context: dep.ContextLength, Slots: int(dep.MaxConcurrentRequests),
			KVType: dep.KVCacheDtype, GPULayers: cfg.GPULayers, MMProj: cfg.MMProjFile,
		})
		if err != nil {
			r.Add(enginekit.CodeCheckpointUnusable, "model", "%v", err)
		} else if dep.ContextLength > 0 && sz.TrainContext > 0 && dep.ContextLength > sz.TrainContext {
			resp.Notes = append(resp.Notes, fmt.Sprintf("context_length %d is beyond the %d tokens %s was trained with", dep.ContextLength, sz.TrainContext, filepath.Base(sz.File)))
		}
	}
	if len(r) > 0 {
		resp.Refusals = r
		return resp, nil
	}
	resp.Notes = append(resp.Notes, "restart only: llama.cpp cannot park; CapyCTL stops the model when it needs the memory")
	if cfg.GPULayers == 0 {
		resp.Notes = append(resp.Notes, "runs on the CPU (n_gpu_layers = 0): charged host RAM only, and the cards are hidden from it")
	}
	if socketFor(inst, lctx) != "" {
		resp.Notes = append(resp.Notes, "serves on a Unix socket in its launch directory (--host ending in .sock): no other local user reaches any of its routes")
	} else {
		resp.Notes = append(resp.Notes, "listens on its loopback port: any local user can call "+strings.Join(publicRoutes, ", ")+", which llama-server does not guard with its key")
	}
	if sz == nil {
		// Written before the model is resolved: nothing to size yet.
		return resp, nil
	}
	resp.Hints = sdk.MemoryHints{
		WeightsBytes:          sz.WeightsBytes + sz.MMProjBytes,
		KVBytesPerToken:       sz.KVBytesPerToken,
		KVCacheBytes:          sz.KVCacheBytes,
		ReadyDeviceBytes:      sz.ReadyDeviceBytes(),
		ReadyHostBytes:        sz.ReadyHostBytes(),
		StartupDeviceBytes:    sz.ReadyDeviceBytes(),
		ContextLength:         sz.Context,
		MaxConcurrentRequests: int32(sz.Slots),
		Source:                "gguf_header",
	}
	resp.StartupTimeout = startupTimeout(sz.WeightsBytes)
	resp.Argv = renderArgv(inst, dep, lctx, cfg, sz)
	resp.Env = renderEnv(dep, host, lctx, cfg)
	resp.Workdir = lctx.LaunchDir
	return resp, nil
}

// startupTimeout is 120 s plus 10 s per GB of weights, at most 30 min.
func startupTimeout(weights int64) time.Duration {
	t := startupBase + time.Duration(weights/1_000_000_000)*startupPerGB
	return min(t, startupMax)
}

// hardening are flags that keep llama-server from sharing, refitting,
// caching, fetching or serving what CapyCTL does not size or control.
// Older builds lack some; they lack the behaviour too, so a flag the
// build's --help does not list is left out.
var hardening = [][]string{
	{"--no-kv-unified"},
	{"--fit", "off"},
	{"--cache-ram", "0"},
	{"--no-context-shift"},
	{"--offline"},
	{"--no-webui"},
}

// supports reports whether the build takes an option (or its --no- or
// positive spelling); unknown options lists mean every option.
func supports(inst *sdk.Installation, opt string) bool {
	list := inst.Details[detailOptions]
	if list == "" {
		return true
	}
	alt := "--no-" + strings.TrimPrefix(opt, "--")
	if rest, ok := strings.CutPrefix(opt, "--no-"); ok {
		alt = "--" + rest
	}
	for _, o := range strings.Fields(list) {
		if o == opt || o == alt {
			return true
		}
	}
	return false
}

// renderArgv is llama-server's command line. Options are long so the
// rendered command reads like the flag table.
func renderArgv(inst *sdk.Installation, dep *sdk.Deployment, lctx *sdk.LaunchContext, cfg Config, sz *Sizing) []string {
	port := "{{port}}"
	if lctx.Port > 0 {
		port = strconv.Itoa(int(lctx.Port))
	}
	// Every layer and the output layer: one more than the layers (a number
	// every build takes, where "all" is newer).
	ngl := strconv.FormatInt(sz.Layers+1, 10)
	if sz.GPULayers < sz.Layers {
		ngl = strconv.FormatInt(sz.GPULayers, 10)
	}
	listen := []string{"--host", "127.0.0.1", "--port", port}
	if sock := socketFor(inst, lctx); sock != "" {
		// The port is ignored for a socket; none is rendered.
		listen = []string{"--host", sock}
	}
	argv := []string{
		inst.Path,
		"--model", sz.File,
	}
	argv = append(argv, listen...)
	argv = append(argv,
		"--alias", dep.ServedName,
		"--ctx-size", strconv.FormatInt(sz.CtxSize, 10),
		"--parallel", strconv.Itoa(sz.Slots),
		"--n-gpu-layers", ngl,
		"--cache-type-k", sz.KVType,
		"--cache-type-v", sz.KVType,
		"--metrics",
		"--slots",
	)
	for _, h := range hardening {
		if supports(inst, h[0]) {
			argv = append(argv, h...)
		}
	}
	if dep.API == "embeddings" {
		// An embedding model: llama-server serves /v1/embeddings only
		// with --embeddings (an option of every build since 2023).
		argv = append(argv, "--embeddings")
	}
	if dep.API == "rerank" {
		// A reranker: llama-server serves /v1/rerank only with
		// --reranking (which also sets the rank pooling).
		argv = append(argv, "--reranking")
	}
	if cfg.MMProjFile != "" {
		p, _ := inside(dep.ModelDir, cfg.MMProjFile)
		argv = append(argv, "--mmproj", p)
	}
	return append(argv, dep.ExtraArgs...)
}

// socketFor is the socket a launch listens on: in its launch directory
// when the build binds a Unix socket for a --host ending in .sock and the
// path fits, else "".
func socketFor(inst *sdk.Installation, lctx *sdk.LaunchContext) string {
	if inst.Details[detailUnixSocket] != "true" {
		return ""
	}
	sock, _ := enginekit.SocketPath(lctx)
	return sock
}

// launchDirs are the empty directories of a launch the engine is pointed
// at, so that it reads no configuration and caches nothing elsewhere.
var launchDirs = []string{"home", "config", "cache"}

// renderEnv is the engine's environment apart from its key. A CPU-only
// model (n_gpu_layers = 0) sees no card: a CUDA build would otherwise
// still take a context and compute buffers on the first card for prompt
// processing, memory its host-RAM-only charge does not hold.
func renderEnv(dep *sdk.Deployment, host *sdk.HostPolicy, lctx *sdk.LaunchContext, cfg Config) map[string]string {
	dir := lctx.LaunchDir
	if dir == "" {
		dir = "{{launch_dir}}"
	}
	env := enginekit.NewEnv(enginekit.SystemPath)
	env["HOME"] = filepath.Join(dir, "home")
	env["XDG_CONFIG_HOME"] = filepath.Join(dir, "config")
	env["XDG_CACHE_HOME"] = filepath.Join(dir, "cache")
	env["LLAMA_CACHE"] = filepath.Join(dir, "cache")
	env.NoTelemetry(host)
	env.PinDevices(lctx)
	env.Merge(host.HostEnv)
	if cfg.GPULayers == 0 {
		env["CUDA_VISIBLE_DEVICES"] = ""
	}
	env.Merge(dep.Env)
	return env
}

// keyEnv carries the per-launch key to llama-server.
const keyEnv = "LLAMA_API_KEY"

// Start implements sdk.Driver: it proves the registered binary is what
// runs, that the leased port is free, and launches llama-server behind the
// launch shim with its key in the environment.
func (d *Driver) Start(_ context.Context, req *sdk.StartRequest) (*sdk.StartResponse, error) {
	inst, dep, lctx, plan := &req.Installation, &req.Deployment, &req.Launch, &req.Plan
	// IMPORTANT: the pinned installation must be what runs.
	digest, err := enginekit.FileDigest(inst.Path)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "llama-server %s: %v", inst.Path, enginekit.UnwrapPathErr(err))
	}
	if inst.Digest != "" && digest != inst.Digest {
		return nil, sdk.Errorf(enginekit.CodeInstallationDrift,
			"llama-server %s changed since it was registered (pinned %s, now %s); register it again with capyctl engine add", inst.Path, inst.Digest, digest)
	}
	if dir := lctx.LaunchDir; dir != "" {
		for _, sub := range launchDirs {
			if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
				return nil, sdk.Errorf(sdk.CodeLaunchFailed, "prepare the launch directory: %v", err)
			}
		}
	}
	secret := map[string]string{}
	if k := req.EngineKey; k != "" {
		secret[keyEnv] = k
	}
	launched, err := enginekit.StartLaunch(enginekit.LaunchOptions{
		Plan: plan, Host: &req.Host, Launch: lctx, SecretEnv: secret, Secrets: []string{req.EngineKey, req.AdminKey},
	})
	if err != nil {
		return nil, err
	}
	h := newHandle(lctx.InstanceID, lctx.LaunchID, *launched, int(lctx.Port), req.EngineKey, dep, plan, d.stopGrace)
	return d.reg.Started(h), nil
}

// slotsOf reads -np and the slot window back from a rendered command.
func slotsOf(argv []string) (slots int, ctx int64) {
	for i := 0; i+1 < len(argv); i++ {
		switch argv[i] {
		case "--parallel":
			slots, _ = strconv.Atoi(argv[i+1])
		case "--ctx-size":
			ctx, _ = strconv.ParseInt(argv[i+1], 10, 64)
		}
	}
	if slots > 0 {
		ctx /= int64(slots)
	}
	return slots, ctx
}
