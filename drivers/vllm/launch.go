// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"context"
	"net/netip"
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

// residency is the effective residency: the deployment's, deep by default.
func residency(dep *sdk.Deployment) string {
	if r := dep.Residency; r != "" {
		return r
	}
	return enginekit.ResidencyDeep
}

// Plan implements sdk.Driver: it checks the deployment (refusals with
// codes) and renders the launch.
func (d *Driver) Plan(_ context.Context, req *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	inst, dep, host, lctx := &req.Installation, &req.Deployment, &req.Host, &req.Launch
	var r enginekit.Refusals
	if api := dep.API; api != "" && api != "chat" && api != "embeddings" && api != "rerank" {
		r.Add(enginekit.CodeCapabilityMissing+":"+api, "api",
			"vLLM answers decision models from their text output instead of their decision head: deploy api = %q on SGLang 0.5.22 or llama.cpp 0.7.0", api)
	}
	cfg := pyengine.DecodeFamily(dep.EngineConfigJSON, Family, configKeys, &r)
	typed := pyengine.TypedFields(dep, map[string]bool{
		"engine_config.vllm.block_size_tokens":      cfg.Has("block_size_tokens"),
		"engine_config.vllm.max_num_batched_tokens": cfg.Has("max_num_batched_tokens"),
		"engine_config.vllm.tool_call_parser":       cfg.Declared("tool_call_parser"),
		"engine_config.vllm.reasoning_parser":       cfg.Declared("reasoning_parser"),
	})
	args := pyengine.Common(Table, dep, host, typed, &r)
	venv := pyengine.PlanVenv(inst, &r)
	res := residency(dep)
	group := dep.Group
	enginekit.CheckGroup(group, enginekit.GroupOptions{RDMADir: d.rdmaDir}, &r)
	if !engine.VersionAtLeast(inst.Version, UDSSince) && !enginekit.GroupWorker(group) {
		// IMPORTANT: without --uds vLLM serves on a loopback port any local
		// user reaches, and answers there without its key on every route
		// outside /v1 (sleep, wake and collective_rpc when it parks): a
		// local user would command the engine behind CapyCTL's back.
		r.Add(enginekit.CodeEngineUnsupported+":no_socket", "engine",
			"vLLM %s predates --uds (0.11): it would serve on a loopback port every local user reaches, its routes outside /v1 without the key; upgrade vLLM (CapyCTL verifies 0.29 to 0.32)", inst.Version)
	}
	lmc := pyengine.PlanLMCache(pyengine.LMCacheInput{
		Family: lmcacheFamily, Inst: inst, Dep: dep, Host: host, Launch: lctx, Venv: venv, Residency: res,
		OwnConnector: flags.Find(args, "--kv-transfer-config") != nil,
		Isolated:     d.netnsPossible() && !enginekit.InGroup(dep),
	}, &r)
	if len(r) > 0 {
		return &sdk.PlanResponse{Refusals: r}, nil
	}

	ck := pyengine.ReadCheckpoint(dep, lctx)
	contextLen := dep.ContextLength
	fitted := false
	// A group member's card holds its share of each token's KV cache.
	kvPerToken := enginekit.GroupShare(ck.KVPerToken, group)
	if contextLen <= 0 && ck.HF != nil && kvPerToken > 0 && ck.KVBudget > 0 {
		// A context the KV budget cannot hold once makes vLLM refuse to
		// start: fit it, in 16-token blocks.
		if fit := ck.KVBudget / kvPerToken / 16 * 16; fit > 0 && fit < ck.HF.MaxPositionEmbeddings {
			contextLen, fitted = fit, true
		}
	}
	parsers := pyengine.FamilyParsers(dep, cfg, args, parserNames)

	sock, tcpWhy := socketFor(inst, lctx)
	if enginekit.GroupWorker(group) {
		// A --headless rank serves no API: no socket to make.
		sock = ""
	}
	argv := pyengine.ServerArgv(venv.Python, Module, "--model", dep, lctx)
	if sock != "" {
		argv = pyengine.OnSocket(argv, "--uds", sock)
	}
	argv = append(argv, groupArgs(group)...)
	maxSeqs := pyengine.MaxConcurrent(dep, pyengine.DefaultMaxConcurrent)
	argv = append(argv, "--max-num-seqs", strconv.Itoa(maxSeqs))
	if contextLen > 0 {
		argv = append(argv, "--max-model-len", strconv.FormatInt(contextLen, 10))
	}
	argv = append(argv, pyengine.TypedArgs(dep)...)
	if dep.CUDAGraphs == "false" {
		argv = append(argv, "--enforce-eager")
	}
	if n, ok := cfg.Int("block_size_tokens"); ok {
		argv = append(argv, "--block-size", strconv.FormatInt(n, 10))
	}
	if n, ok := cfg.Int("max_num_batched_tokens"); ok {
		argv = append(argv, "--max-num-batched-tokens", strconv.FormatInt(n, 10))
	}
	if f := pyengine.Fraction(lctx.DeviceBytes, lctx.DeviceTotalBytes); f != "" {
		argv = append(argv, "--gpu-memory-utilization", f)
	}
	if ck.KVBudget > 0 {
		argv = append(argv, "--kv-cache-memory-bytes", strconv.FormatInt(ck.KVBudget, 10))
	}
	if enginekit.Parks(res) {
		argv = append(argv, "--enable-sleep-mode")
	}
	if s := cfg.String("safetensors_load_strategy"); s != "" {
		argv = append(argv, "--safetensors-load-strategy", s)
	} else if enginekit.Parks(res) {
		// A deep wake under lazy loading reloads far slower.
		argv = append(argv, "--safetensors-load-strategy", "eager")
	}
	// IMPORTANT: prompts and answers never reach a log.
	argv = append(argv, "--no-enable-log-requests", "--no-enable-log-outputs")
	if dep.TrustRemoteCode {
		argv = append(argv, "--trust-remote-code")
	}
	if parsers.Tool != "" {
		argv = append(argv, "--tool-call-parser", parsers.Tool, "--enable-auto-tool-choice")
	}
	if parsers.Reasoning != "" {
		argv = append(argv, "--reasoning-parser", parsers.Reasoning)
	}
	if lmc.Runs() {
		// LMCache's connector for vLLM v1 (vllm/distributed/kv_transfer/
		// kv_connector/v1/lmcache_connector.py), storing and loading KV.
		argv = append(argv, "--kv-transfer-config", lmcacheConnector)
		// vLLM reports usage.prompt_tokens_details.cached_tokens (the
		// prefix LMCache or its own cache answered) only with this flag
		// (OpenAIServing's enable_prompt_tokens_details, False by default).
		if flags.Find(args, "--enable-prompt-tokens-details") == nil {
			argv = append(argv, "--enable-prompt-tokens-details")
		}
	}
	argv = append(argv, dep.ExtraArgs...)

	env := pyengine.BaseEnv(pyengine.EnvOptions{Venv: venv.Dir, Host: host, Launch: lctx})
	if enginekit.TelemetryOff(host) {
		env["VLLM_DO_NOT_TRACK"] = "1"
		env["VLLM_NO_USAGE_STATS"] = "1"
	}
	if enginekit.Parks(res) {
		// vLLM parses it with int(): "1", never "true".
		env["VLLM_SERVER_DEV_MODE"] = "1"
	}
	env.Merge(dep.Env)
	groupEnv(env, group)

	resp := pyengine.Rendered{Argv: argv, Env: env, Checkpoint: ck, ContextLength: contextLen, MaxConcurrent: maxSeqs,
		Parsers: parsers, Residency: res, Group: group}.Plan(lctx)
	switch {
	case enginekit.GroupWorker(group):
		resp.Notes = append(resp.Notes, "a --headless rank: it serves no HTTP, so readiness is its process running and park, wake and load call nothing on this host")
	case sock != "":
		resp.Notes = append(resp.Notes, "serves on a Unix socket in its launch directory (--uds): no other local user reaches any of its routes")
	case enginekit.Parks(res):
		resp.Notes = append(resp.Notes, "listens on its loopback port ("+tcpWhy+"): any local user can call /sleep, /wake_up and /collective_rpc, which vLLM does not guard with its key (parking turns on its development routes)")
	default:
		resp.Notes = append(resp.Notes, "listens on its loopback port ("+tcpWhy+"): any local user can call the routes outside /v1, which vLLM does not guard with its key")
	}
	pyengine.ApplyLMCache(resp, lmc)
	if fitted {
		resp.Notes = append(resp.Notes, "context fitted to the KV budget: --max-model-len "+strconv.FormatInt(contextLen, 10))
	}
	return resp, nil
}

// groupArgs are a group member's options, the same on every rank but the
// node rank and --headless (vLLM's "Running vLLM with MultiProcessing",
// docs.vllm.ai Parallelism and scaling, vllm-project/vllm#30509; the help
// of ParallelConfig.nnodes, node_rank, master_addr, master_port and
// distributed_executor_backend in vllm/config/parallel.py): the topology
// over all machines, the multiprocessing backend (no Ray cluster beside the
// engine), the head's address and rendezvous port, and --headless on every
// rank but the head, which alone serves the API. None without a group.
func groupArgs(g *sdk.Group) []string {
	if g == nil {
		return nil
	}
	out := []string{
		"--tensor-parallel-size", strconv.Itoa(int(g.TensorParallel)),
		"--pipeline-parallel-size", strconv.Itoa(int(g.PipelineParallel)),
		"--distributed-executor-backend", "mp",
		"--nnodes", strconv.Itoa(int(g.Size)),
		"--node-rank", strconv.Itoa(int(g.Rank)),
		"--master-addr", g.HeadAddress,
		"--master-port", strconv.Itoa(int(g.RendezvousPort)),
	}
	if enginekit.GroupWorker(g) {
		out = append(out, "--headless")
	}
	return out
}

// groupEnv sets a group member's variables: GLOO_SOCKET_IFNAME
// (pyengine.GroupEnv) and VLLM_HOST_IP, the address this rank advertises
// to the others ("unique for each worker"; vLLM's distributed serving docs
// ask for "an address on a private network segment"), when the peer
// address is an IP address. Never NCCL_*.
func groupEnv(env enginekit.Env, g *sdk.Group) {
	if g == nil {
		return
	}
	pyengine.GroupEnv(env, g)
	if ip, err := netip.ParseAddr(g.PeerAddress); err == nil {
		env["VLLM_HOST_IP"] = ip.Unmap().String()
	}
}

// lmcacheFamily is vLLM in the LMCache decision: 0.32.0 is the first
// release CapyCTL runs a private LMCache with.
var lmcacheFamily = pyengine.LMCacheFamily{Name: "vLLM", Since: "0.32.0"}

// lmcacheConnector is the --kv-transfer-config that connects vLLM to
// LMCache, storing and loading (LMCache's quickstart; NVIDIA Dynamo's
// LMCache page uses the same JSON).
const lmcacheConnector = `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`

// UDSSince is the first vLLM release CapyCTL serves on a Unix socket
// (--uds, "Unix domain socket path. If set, host and port arguments are
// ignored.", FrontendArgs in vllm/entrypoints/openai/cli_args.py, added by
// vllm-project/vllm#18097, opened in May 2025 and merged in August 2025 per
// vLLM's weekly summaries of 2025-08-09 and 2025-08-15, so in 0.10.2 at the
// latest). It was read first-hand in the 0.11 series, the one CapyCTL uses
// it from; an older release is refused (Plan: engine_unsupported:no_socket)
// rather than served on a port every local user reaches. A launch
// directory whose path is too long for a socket still keeps the port, and
// reports the exposure.
var UDSSince = []int{0, 11}

// socketFor is the socket a launch serves on, or "" and why it keeps the
// port.
func socketFor(inst *sdk.Installation, lctx *sdk.LaunchContext) (string, string) {
	if !engine.VersionAtLeast(inst.Version, UDSSince) {
		return "", "vLLM " + inst.Version + " predates --uds, which CapyCTL uses from 0.11"
	}
	return enginekit.SocketPath(lctx)
}

// guardedPrefixes are the paths vLLM's AuthenticationMiddleware checks the
// key on (/v1 alone up to 0.15); every other route answers without it.
var guardedPrefixes = enginefacts.Values(enginefacts.VLLM.GuardedPrefixes)

// openRoutes are the routes a vLLM on TCP answers without the key: its
// always-on routes outside the guarded prefixes (/invocations serves the
// same inference as /v1) and, in development mode (parking), the sleep,
// reload and cache routes.
func openRoutes(key string, parks bool) []string {
	if key == "" {
		return enginekit.OpenToAll
	}
	r := enginefacts.Values(enginefacts.VLLM.OpenRoutes)
	if parks {
		r = append(r, enginefacts.Values(enginefacts.VLLM.ParkOpenRoutes)...)
	}
	return r
}

// endpoint is how the router reaches an instance: its socket when it has
// one, else its port with what that leaves open; the request ID in
// X-Request-Id; and a non-streamed request forwarded as it is: vLLM's chat
// route runs under with_cancellation (vllm/entrypoints/utils.py), which
// races the handler against the client's http.disconnect and aborts the
// request in the engine the moment the connection closes, streamed or not
// (engines.md §1.7, note 1; every verified release has it).
// ns, when its PID is set, is the engine's network namespace of its own
// (it joined its LMCache server's): a port there is reached only through
// it.
func endpoint(port int, key, served, sock string, parks bool, ns engineapi.NetnsAddr) *sdk.Endpoint {
	ep := enginekit.NewEndpoint(port, served, key)
	ep.RequestIDHeader = "X-Request-Id"
	ep.NonStreamedHangup = sdk.NonStreamedHangupStops
	// Chat and completion requests take cache_salt, which salts the
	// prefix cache's block hashes (vllm/v1/request.py Request.cache_salt).
	ep.CacheSalt = true
	// Anthropic's Messages (and its token count) and OpenAI's Responses are
	// served by vLLM itself in every verified release (the engine table's
	// API routes, with their sources): their requests go there.
	ep.MessagesPath = enginefacts.VLLM.Route(enginefacts.RouteMessages)
	ep.CountTokensPath = enginefacts.VLLM.Route(enginefacts.RouteCountTokens)
	ep.ResponsesPath = enginefacts.VLLM.Route(enginefacts.RouteResponses)
	x := enginekit.Exposure{Socket: sock, Netns: ns}
	if sock == "" {
		x.OpenRoutes = openRoutes(key, parks)
		x.Note = "vLLM guards only " + strings.Join(guardedPrefixes, ", ") + " with its key"
	}
	return x.Apply(ep)
}

// Start implements sdk.Driver: the pinned installation must be what runs;
// the key reaches vLLM through VLLM_API_KEY.
func (d *Driver) Start(_ context.Context, req *sdk.StartRequest) (*sdk.StartResponse, error) {
	inst, dep, lctx := &req.Installation, &req.Deployment, &req.Launch
	if _, err := pyengine.CheckPinned(inst.Path, inst.Digest); err != nil {
		return nil, err
	}
	secretEnv := map[string]string{}
	if k := req.EngineKey; k != "" {
		secretEnv["VLLM_API_KEY"] = k
	}
	// The instance's LMCache server gets a network namespace of its own,
	// and vLLM joins it (its API is its Unix socket, a path that every
	// namespace reaches): no other local user reaches the cache.
	lmc := req.Plan.LMCache.Runs
	if lmc && (!d.netnsPossible() || enginekit.InGroup(dep)) {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "the plan runs LMCache, which this driver cannot isolate: %s", pyengine.LMCacheIsolationNeeded)
	}
	launched, server, err := enginekit.StartWithLMCache(enginekit.LaunchOptions{
		Plan: &req.Plan, Host: &req.Host, Launch: lctx, SecretEnv: secretEnv,
		Secrets:      []string{req.EngineKey, req.AdminKey},
		NetNamespace: lmc,
	})
	if err != nil {
		return nil, err
	}
	res := residency(dep)
	if r := req.Plan.Residency; r != "" {
		res = r
	}
	sock := enginekit.SocketInArgv(req.Plan.Argv, "--uds")
	in := d.instance(lctx.InstanceID, lctx.LaunchID, *launched, int(lctx.Port), req.EngineKey, dep, sock, res, lmc)
	pyengine.SaltWithLMCache(in.Endpoint, server != nil)
	if server != nil {
		in.LMCachePort, in.LMCacheServer = int(lctx.LMCachePort), server
	}
	return d.reg.Started(in), nil
}

// instance builds the driver's handle of a launch that serves on sock (""
// for its port) at residency res; netns says the engine runs in a network
// namespace of its own (its LMCache server's).
func (d *Driver) instance(id, launchID string, l proc.Launched, port int, key string, dep *sdk.Deployment, sock, res string, netns bool) *enginekit.Instance {
	var ns engineapi.NetnsAddr
	if netns {
		ns = engineapi.NetnsAddr{Engine: l.Engine, Port: port}
	}
	ep := endpoint(port, key, dep.ServedName, sock, enginekit.Parks(res), ns)
	if g := dep.Group; g != nil && g.Rank > 0 {
		// A --headless rank runs no API server: nothing of it answers HTTP.
		ep.OpenRoutes = nil
		ep.ExposureNote = "a --headless group rank serves no HTTP API; its group traffic on the peer address is unauthenticated"
	}
	in := enginekit.NewInstance(id, launchID, l, port, ep)
	in.API = "chat"
	switch dep.API {
	case "embeddings":
		in.API = "embeddings" // a pooling model: vLLM serves /v1/embeddings for it
	case "rerank":
		in.API = "rerank" // a cross-encoder: vLLM serves /v1/rerank for it
	}
	in.Residency = res
	in.ModelDir = dep.ModelDir
	in.Group = dep.Group
	return in
}
