// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/drivers/internal/engine"
	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginefacts"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/flags"
	"github.com/capyctl/capyctl/sdk/proc"
)

// speculative reports whether extra_args turn speculative decoding on: a
// wake would not restore the draft model, so such a deployment restarts.
func speculative(args []flags.Arg) bool {
	return flags.Find(args, "--speculative-algorithm") != nil
}

// residency is the effective residency: the deployment's; by default deep,
// or restart_only for a decision model, speculative decoding or a group
// member (SGLang groups restart instead of parking).
func residency(dep *sdk.Deployment, args []flags.Arg) string {
	if r := dep.Residency; r != "" {
		return r
	}
	if dep.API == "decisions" || speculative(args) || enginekit.InGroup(dep) {
		return enginekit.ResidencyRestartOnly
	}
	return enginekit.ResidencyDeep
}

// Plan implements sdk.Driver: it checks the deployment (refusals with
// codes) and renders the launch.
func (d *Driver) Plan(_ context.Context, req *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	inst, dep, host, lctx := &req.Installation, &req.Deployment, &req.Host, &req.Launch
	var r enginekit.Refusals
	cfg := pyengine.DecodeFamily(dep.EngineConfigJSON, Family, configKeys, &r)
	typed := pyengine.TypedFields(dep, map[string]bool{
		"engine_config.sglang.chunked_prefill_size": cfg.Has("chunked_prefill_size"),
		"engine_config.sglang.tool_call_parser":     cfg.Declared("tool_call_parser"),
		"engine_config.sglang.reasoning_parser":     cfg.Declared("reasoning_parser"),
	})
	args := pyengine.Common(Table, dep, host, typed, &r)
	res := residency(dep, args)
	switch api := dep.API; api {
	case "", "chat":
	case "decisions":
		if inst.Version != "" && !pyengine.VersionAtLeast(inst.Version, DecisionsSince) {
			r.Add(enginekit.CodeCapabilityMissing+":decisions", "api", "decision models need SGLang %s or newer; engine %s is %s", DecisionsSince, inst.Name, inst.Version)
		}
		if enginekit.Parks(res) {
			r.Add(enginekit.CodeCapabilityMissing+":deep_park", "residency", "decision models restart instead of parking: remove residency or set restart_only")
		}
		for _, k := range []string{"tool_call_parser", "reasoning_parser"} {
			if cfg.Declared(k) {
				r.Add(flags.CodeInvalidConfig, "engine_config.sglang."+k, "decision models run without a tool-call or reasoning parser")
			}
		}
	case "embeddings":
		for _, k := range []string{"tool_call_parser", "reasoning_parser"} {
			if cfg.Declared(k) {
				r.Add(flags.CodeInvalidConfig, "engine_config.sglang."+k, "embedding models run without a tool-call or reasoning parser")
			}
		}
	default:
		r.Add(enginekit.CodeCapabilityMissing+":"+api, "api", "SGLang serves the chat, decisions and embeddings APIs, not %q", api)
	}
	if speculative(args) && enginekit.Parks(res) {
		r.Add(enginekit.CodeCapabilityMissing+":deep_park", "residency",
			"with speculative decoding a wake would not restore the draft model's weights: remove residency or set restart_only")
	}
	group := dep.Group
	if group != nil && enginekit.Parks(res) {
		r.Add(enginekit.CodeCapabilityMissing+":deep_park", "residency",
			"SGLang groups restart instead of parking (the memory saver is not verified across machines): declare residency = %q", enginekit.ResidencyRestartOnly)
	}
	enginekit.CheckGroup(group, enginekit.GroupOptions{RDMADir: d.rdmaDir}, &r)
	venv := pyengine.PlanVenv(inst, &r)
	lmc := pyengine.PlanLMCache(pyengine.LMCacheInput{
		Family: lmcacheFamily, Inst: inst, Dep: dep, Host: host, Launch: lctx, Venv: venv, Residency: res,
		Isolated: d.netnsPossible() && !enginekit.InGroup(dep),
	}, &r)
	if len(r) > 0 {
		return &sdk.PlanResponse{Refusals: r}, nil
	}

	ck := pyengine.ReadCheckpoint(dep, lctx)
	totalTokens, _ := cfg.Int("max_total_tokens")
	if totalTokens <= 0 && ck.KVPerToken > 0 && ck.KVBudget > 0 {
		totalTokens = ck.KVBudget / ck.KVPerToken
	}
	workers, ok := cfg.Int("tokenizer_workers")
	if !ok {
		workers = 1
	}
	parsers := pyengine.FamilyParsers(dep, cfg, args, parserNames)

	// A worker keeps --host and --port: SGLang's non-zero node ranks serve
	// their health check there.
	argv := pyengine.ServerArgv(venv.Python, Module, "--model-path", dep, lctx)
	argv = append(argv, groupArgs(group)...)
	maxRunning := pyengine.MaxConcurrent(dep, pyengine.DefaultMaxConcurrent)
	argv = append(argv, "--max-running-requests", strconv.Itoa(maxRunning))
	if n := dep.ContextLength; n > 0 {
		argv = append(argv, "--context-length", strconv.FormatInt(n, 10))
	}
	argv = append(argv, pyengine.TypedArgs(dep)...)
	if dep.CUDAGraphs == "false" {
		argv = append(argv, "--disable-cuda-graph")
	}
	if f := pyengine.Fraction(lctx.DeviceBytes, lctx.DeviceTotalBytes); f != "" {
		argv = append(argv, "--mem-fraction-static", f)
	}
	if totalTokens > 0 {
		argv = append(argv, "--max-total-tokens", strconv.FormatInt(totalTokens, 10))
	}
	if n, ok := cfg.Int("chunked_prefill_size"); ok {
		argv = append(argv, "--chunked-prefill-size", strconv.FormatInt(n, 10))
	}
	if enginekit.Parks(res) {
		argv = append(argv, "--enable-memory-saver")
	}
	if res == enginekit.ResidencyHostBacked {
		argv = append(argv, "--enable-weights-cpu-backup")
	}
	argv = append(argv, "--enable-metrics", "--tokenizer-worker-num", strconv.FormatInt(workers, 10))
	if dep.TrustRemoteCode {
		argv = append(argv, "--trust-remote-code")
	}
	if dep.API == "embeddings" {
		// An embedding model: SGLang serves /v1/embeddings (and no
		// generation) only with --is-embedding.
		argv = append(argv, "--is-embedding")
	}
	if parsers.Tool != "" {
		argv = append(argv, "--tool-call-parser", parsers.Tool)
	}
	if parsers.Reasoning != "" {
		argv = append(argv, "--reasoning-parser", parsers.Reasoning)
	}
	if lmc.Runs() {
		// SGLang's LMCache integration (ServerArgs.enable_lmcache); it
		// configures LMCache from the LMCACHE_* variables.
		argv = append(argv, "--enable-lmcache")
		// SGLang reports usage.prompt_tokens_details.cached_tokens only
		// with --enable-cache-report (ServerArgs.enable_cache_report,
		// False by default).
		if !hasArg(dep.ExtraArgs, "--enable-cache-report") {
			argv = append(argv, "--enable-cache-report")
		}
	}
	if dir := lctx.LaunchDir; dir != "" {
		argv = append(argv, "--config", filepath.Join(dir, configFile))
	}
	argv = append(argv, dep.ExtraArgs...)

	env := pyengine.BaseEnv(pyengine.EnvOptions{Venv: venv.Dir, Host: host, Launch: lctx})
	env["SGLANG_PLUGINS"] = NoPlugins
	if dirs := venv.PthDirs("nvidia_cutlass_dsl"); len(dirs) > 0 {
		// SGLang 0.5.22 imports cutlass from nvidia-cutlass-dsl, which only
		// a .pth hook puts on the path: add that directory, run no hook.
		env["PYTHONPATH"] = strings.Join(dirs, ":")
	}
	env.Merge(dep.Env)
	pyengine.GroupEnv(env, group)

	resp := pyengine.Rendered{Argv: argv, Env: env, Checkpoint: ck, ContextLength: dep.ContextLength, MaxConcurrent: maxRunning,
		Parsers: parsers, Residency: res, Group: group}.Plan(lctx)
	pyengine.ApplyLMCache(resp, lmc)
	if enginekit.Parks(res) {
		resp.Notes = append(resp.Notes, "parks with SGLang's memory saver (release_memory_occupation / resume_memory_occupation)")
	}
	if enginekit.GroupWorker(group) {
		resp.Notes = append(resp.Notes, "a worker rank: it serves only SGLang's health check (GET /health) on its loopback port, and no inference")
	}
	// The same note whoever plans: the golden plans do not depend on the
	// user the tests run as.
	resp.Notes = append(resp.Notes, "listens on its port in a network namespace of its own when the role runs as root (no other local user reaches it), "+
		"else on its loopback port, where any local user can call "+strings.Join(publicRoutes, ", ")+" without the key ("+noSocketNote+")")
	if workers != 1 {
		resp.Notes = append(resp.Notes, "more than one tokenizer worker: an abort by request ID may not reach the worker that holds the request; hang-ups close the connection")
	}
	return resp, nil
}

// groupArgs are a group member's options (docs.sglang.io "Multi-Node
// Deployment"; ServerArgs in python/sglang/srt/server_args.py): the
// tensor- and pipeline-parallel sizes over all machines, the number of
// machines, this one's rank and the head's address and rendezvous port
// (--dist-init-addr host:port, the same on every rank: torch.distributed's
// rendezvous on the head, and the base of the head's ZeroMQ ports). None
// without a group.
func groupArgs(g *sdk.Group) []string {
	if g == nil {
		return nil
	}
	return []string{
		"--tp-size", strconv.Itoa(int(g.TensorParallel)),
		"--pp-size", strconv.Itoa(int(g.PipelineParallel)),
		"--nnodes", strconv.Itoa(int(g.Size)),
		"--node-rank", strconv.Itoa(int(g.Rank)),
		"--dist-init-addr", enginekit.RendezvousAddr(g),
	}
}

// lmcacheFamily is SGLang in the LMCache decision: 0.5.22 is the first
// release CapyCTL runs a private LMCache with, and decision models run
// without it.
var lmcacheFamily = pyengine.LMCacheFamily{Name: "SGLang", Since: "0.5.22", NoDecisions: true}

// engineKey is the key SGLang is given for a launch key. IMPORTANT: SGLang
// turns its --config file into command-line tokens ("--api-key", value) and
// parses them again, so a value that starts with "-" reads as a missing
// argument and the launch fails; launch keys are base64url and one in 64
// starts with "-". Such a key gets a letter in front, the same way every
// time, so that a re-attached driver derives the same key.
func engineKey(key string) string {
	if strings.HasPrefix(key, "-") {
		return "k" + key
	}
	return key
}

// endpoint is how the router reaches an instance: the request ID in the
// body's "rid", by which a request is aborted (with one tokenizer worker;
// with more, an abort may miss the worker and hang-ups close the
// connection), and decisions for a decision model.
func endpoint(port int, key string, dep *sdk.Deployment, workers int64, netns engineapi.NetnsAddr) *sdk.Endpoint {
	ep := enginekit.NewEndpoint(port, dep.ServedName, engineKey(key))
	ep.RequestIDField = RequestIDField
	ep.AbortMode = sdk.AbortModeRequestID
	// ChatCompletionRequest and CompletionRequest have cache_salt
	// (python/sglang/srt/entrypoints/openai/protocol.py).
	ep.CacheSalt = true
	// With the abort by rid a non-streamed request stops as promptly as a
	// streamed one, so it goes to the engine as it is. Without it, SGLang
	// notices a non-streamed client's hang-up only when
	// TokenizerManager._wait_one_response wakes up to check
	// (engines.md §2.4, its period unconfirmed): stream instead.
	ep.NonStreamedHangup = sdk.NonStreamedHangupStops
	if dep.API == "decisions" {
		ep.DecisionsPath = decisionsPath
	}
	if workers > 1 {
		ep.AbortMode = sdk.AbortModeCloseConnection
		ep.NonStreamedHangup = sdk.NonStreamedHangupStream
	}
	x := enginekit.Exposure{OpenRoutes: enginekit.OpenToAll, Note: noSocketNote, Netns: netns}
	if key != "" {
		x.OpenRoutes = publicRoutes
	}
	return x.Apply(ep)
}

// noSocketNote says why SGLang stays on its port: its launch_server has no
// Unix-socket option (uvicorn.run with host and port only in
// python/sglang/srt/entrypoints/http_server.py; sgl-project/sglang#14258
// asked for one, #26006 proposed --uds and was closed unmerged).
const noSocketNote = "SGLang cannot listen on a Unix socket; every other route, release and resume included, needs the key"

// publicRoutes are the routes SGLang answers without its key: its auth
// middleware lets OPTIONS and every path starting /health (GET /health
// and /health_generate run a one-token generation), /metrics and, in
// newer releases, /ready through (decide_request_auth in
// python/sglang/srt/utils/auth.py; older add_api_key_middleware in
// python/sglang/srt/utils.py).
// The list is the engine table's (sdk/enginefacts).
var publicRoutes = enginefacts.Values(enginefacts.SGLang.OpenRoutes)

// tokenizerWorkers reads engine_config.sglang.tokenizer_workers (1 when
// unset or unreadable).
func tokenizerWorkers(dep *sdk.Deployment) int64 {
	var r enginekit.Refusals
	if n, ok := pyengine.DecodeFamily(dep.EngineConfigJSON, Family, configKeys, &r).Int("tokenizer_workers"); ok {
		return n
	}
	return 1
}

// shm is the shared-memory tracker of a launch.
func shm(launchDir string) engine.Shm {
	return engine.Shm{Dir: engine.ShmDir, LaunchDir: launchDir, Prefixes: shmPrefixes}
}

// writeConfig writes the launch's private configuration file: the key,
// readable by the launch's user only, in the launch's private directory.
func writeConfig(launchDir, key string) error {
	var b strings.Builder
	b.WriteString("# written by CapyCTL for one launch; removed once the engine is ready\n")
	if key != "" {
		b.WriteString("api-key: " + strconv.Quote(engineKey(key)) + "\n")
	}
	if err := os.MkdirAll(launchDir, 0o700); err != nil {
		return err
	}
	p := filepath.Join(launchDir, configFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// removeConfig removes the launch's configuration file (the engine read it
// at start).
func removeConfig(launchDir string) {
	if launchDir != "" {
		_ = os.Remove(filepath.Join(launchDir, configFile))
	}
}

// Start implements sdk.Driver: the pinned installation must be what runs;
// the key reaches SGLang through the launch's private configuration file;
// the shared-memory segments that exist before the launch are noted so that
// only the launch's own are cleaned up.
func (d *Driver) Start(_ context.Context, req *sdk.StartRequest) (*sdk.StartResponse, error) {
	inst, dep, lctx := &req.Installation, &req.Deployment, &req.Launch
	if _, err := pyengine.CheckPinned(inst.Path, inst.Digest); err != nil {
		return nil, err
	}
	if lctx.LaunchDir == "" {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "start needs a launch directory")
	}
	if err := writeConfig(lctx.LaunchDir, req.EngineKey); err != nil {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "write the launch's configuration: %v", err)
	}
	_ = shm(lctx.LaunchDir).RecordBefore()
	// SGLang cannot listen on a Unix socket: a driver that runs as root
	// launches it in a network namespace of its own instead, except a
	// group member, whose ranks reach each other over the host's network.
	netns := d.netnsPossible() && !enginekit.InGroup(dep)
	launched, server, err := enginekit.StartWithLMCache(enginekit.LaunchOptions{
		Plan: &req.Plan, Host: &req.Host, Launch: lctx,
		Secrets:      []string{engineKey(req.EngineKey), req.EngineKey, req.AdminKey},
		NetNamespace: netns,
	})
	if err != nil {
		removeConfig(lctx.LaunchDir)
		return nil, err
	}
	in := d.instance(lctx.InstanceID, lctx.LaunchID, *launched, int(lctx.Port), req.EngineKey, dep, req.Plan.Residency, netns)
	pyengine.SaltWithLMCache(in.Endpoint, server != nil)
	if server != nil {
		in.LMCachePort, in.LMCacheServer = int(lctx.LMCachePort), server
	}
	return d.reg.Started(in), nil
}

// instance builds the driver's handle of a launch.
// netns says the engine listens in a network namespace of its own.
func (d *Driver) instance(id, launchID string, l proc.Launched, port int, key string, dep *sdk.Deployment, res string, netns bool) *enginekit.Instance {
	var ns engineapi.NetnsAddr
	if netns {
		ns = engineapi.NetnsAddr{Engine: l.Engine, Port: port}
	}
	in := enginekit.NewInstance(id, launchID, l, port, endpoint(port, key, dep, tokenizerWorkers(dep), ns))
	in.API = dep.API
	if in.API == "" {
		in.API = "chat"
	}
	if res == "" {
		args, _ := Table.SplitArgs(dep.ExtraArgs)
		res = residency(dep, args)
	}
	in.Residency = res
	in.ModelDir = dep.ModelDir
	in.Group = dep.Group
	return in
}

// hasArg reports whether args hold the option name, alone or as name=value.
func hasArg(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}
