// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginefacts

// ref is the engine reference every driver was written from.
const ref = "engines.md "

// VLLM is vLLM's table.
var VLLM = &Engine{
	Family:   "vllm",
	Name:     "vLLM",
	Verified: []string{"0.29", "0.30", "0.31", "0.32"},
	Versions: "0.29 to 0.32",
	Park: []Fact{
		{Key: "sleep", Value: "/sleep", Note: "POST ?level=N; development mode and --enable-sleep-mode", Source: ref + "§1.4; vllm/entrypoints/serve/sleep/api_router.py (commit 09cb327f)"},
		{Key: "wake", Value: "/wake_up", Note: "POST ?tags=weights, then ?tags=kv_cache", Source: ref + "§1.4; vllm/entrypoints/serve/sleep/api_router.py"},
		{Key: "is_sleeping", Value: "/is_sleeping", Note: "GET {\"is_sleeping\": bool}", Source: ref + "§1.4; vllm/entrypoints/serve/sleep/api_router.py"},
		{Key: "collective_rpc", Value: "/collective_rpc", Note: "POST {\"method\":\"reload_weights\"} after a level 2 sleep", Source: ref + "§1.7 note 3 (docs.vllm.ai features/sleep_mode, via production-stack issue #953)"},
		{Key: "reset_prefix_cache", Value: "/reset_prefix_cache", Note: "POST after a wake", Source: ref + "§1.4 (development routes); §1.7 note 3"},
	},
	Levels: []Fact{
		{Value: "1", Note: "offloads the weights to host memory, discards the KV cache: host_backed", Source: ref + "§1.7 note 3 (docs.vllm.ai features/sleep_mode)"},
		{Value: "2", Note: "discards the weights and the KV cache; a wake reloads the weights from disk: deep", Source: ref + "§1.7 note 3 (docs.vllm.ai features/sleep_mode)"},
	},
	Abort: []Fact{
		{Value: "close the connection", Note: "with_cancellation aborts the request on http.disconnect, streamed or not", Source: ref + "§1.7 note 1; vllm/entrypoints/utils.py"},
		{Value: "/abort_requests", Note: "POST {\"request_ids\":[...]}; not used (which flag gates it is unconfirmed)", Source: ref + "§1.4; vllm/entrypoints/rl/online/api_router.py"},
	},
	Metrics: Metrics{
		Running: Fact{Value: "vllm:num_requests_running", Source: ref + "§1.6"},
		Waiting: Fact{Value: "vllm:num_requests_waiting", Source: ref + "§1.6"},
		KVUsage: []Fact{
			{Value: "vllm:kv_cache_usage_perc", Source: ref + "§1.6"},
			{Value: "vllm:gpu_cache_usage_perc", Note: "older name", Source: ref + "§1.6"},
		},
		Figures: []Fact{
			{Value: "vllm:prompt_tokens_total", Source: ref + "§1.6"},
			{Value: "vllm:generation_tokens_total", Source: ref + "§1.6"},
			{Value: "vllm:num_preemptions_total", Source: ref + "§1.6"},
			{Value: "vllm:prefix_cache_queries_total", Source: ref + "§1.6"},
			{Value: "vllm:prefix_cache_hits_total", Source: ref + "§1.6"},
		},
	},
	GuardedPrefixes: []Fact{
		{Value: "/v1", Source: ref + "§1.4 (auth scope); vllm.entrypoints.serve.middleware.authenticate"},
		{Value: "/v2", Since: "0.16", Note: "up to 0.15 only /v1 is guarded", Source: ref + "§1.4 (auth scope); GUARDED_PREFIX"},
		{Value: "/inference", Since: "0.16", Source: ref + "§1.4 (auth scope); GUARDED_PREFIX"},
		{Value: "/cohere", Since: "0.16", Source: ref + "§1.4 (auth scope); GUARDED_PREFIX"},
	},
	OpenRoutes: vllmOpen("/health", "/metrics", "/version", "/ping", "/invocations", "/tokenize", "/detokenize"),
	ParkOpenRoutes: vllmOpen("/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache",
		"/server_info", "/pause", "/resume"),
	Env: []Fact{pythonHashSeed, ncclNet},
	APIRoutes: []Fact{
		{Key: RouteMessages, Value: "/v1/messages", Note: "native: vLLM converts it to its chat serving (stops on a hang-up: with_cancellation; names the request by X-Request-Id, as chat)", Source: vllmAnthropic},
		{Key: RouteCountTokens, Value: "/v1/messages/count_tokens", Note: "native: counts the conversation and its tools through the model's chat template; answers {\"input_tokens\":N}", Source: vllmAnthropic},
		{Key: RouteResponses, Value: "/v1/responses", Note: "native, always with store false and the whole conversation in input: vLLM keeps responses only with VLLM_ENABLE_RESPONSES_API_STORE, in memory, never removed", Source: "vllm/entrypoints/openai/responses/api_router.py and serving.py (commit 0001948b)"},
		{Value: "/tokenize", Note: "counts messages through the chat template too; not used: /v1/messages/count_tokens counts Anthropic's request as is", Source: ref + "§1.4 (open routes); vllm/entrypoints/serve/tokenize"},
	},
}

// vllmAnthropic is where vLLM serves Anthropic's Messages API.
const vllmAnthropic = "vllm/entrypoints/anthropic/api_router.py and serving.py (commit 01540b75)"

// pythonHashSeed is the seed every launch of an instance with LMCache gets
// (pyengine.LMCacheHashSeed).
var pythonHashSeed = Fact{Value: "PYTHONHASHSEED", Note: "with LMCache: the same for every launch of an instance (derived from it and its LMCache server's port), so that its chunk keys survive a restart_only park",
	Source: "ChunkedTokenDatabase in lmcache/v1/token_database.py chains keys from vLLM's NONE_HASH; init_none_hash in vllm/v1/core/kv_cache_utils.py draws it from os.urandom unless PYTHONHASHSEED is set; vllm-project/vllm#21161"}

// ncclNet makes NCCL fail rather than fall back to TCP (require_rdma).
var ncclNet = Fact{Value: "NCCL_NET=IB", Note: "a group member on a host with require_rdma: NCCL uses InfiniBand or RoCE verbs or fails its start; the rendezvous and Gloo stay on TCP",
	Source: "NCCL_NET (since 2.10), docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html; ncclNetInit in NVIDIA/nccl src/net.cc (\"Error: network %s not found.\")"}

// vllmOpen are routes outside vLLM's guarded prefixes.
func vllmOpen(routes ...string) []Fact {
	out := make([]Fact, len(routes))
	for i, r := range routes {
		out[i] = Fact{Value: r, Note: "outside the guarded prefixes", Source: ref + "§1.4 (auth scope): AuthenticationMiddleware skips every path not under GUARDED_PREFIX"}
		if r == "/invocations" {
			out[i].Note = "the same inference as /v1, outside the guarded prefixes"
		}
	}
	return out
}

// SGLang is SGLang's table.
var SGLang = &Engine{
	Family:   "sglang",
	Name:     "SGLang",
	Verified: []string{"0.5.20", "0.5.21", "0.5.22"},
	Versions: "0.5.20 to 0.5.22",
	Park: []Fact{
		{Key: "release", Value: "/release_memory_occupation", Note: "POST {\"tags\":[\"weights\",\"kv_cache\"]}; needs --enable-memory-saver", Source: ref + "§2.2; python/sglang/srt/entrypoints/http_server.py (commit 0025436e)"},
		{Key: "resume", Value: "/resume_memory_occupation", Note: "POST {\"tags\":[...]}", Source: ref + "§2.2; python/sglang/srt/entrypoints/http_server.py (commit 0025436e)"},
		{Key: "reload", Value: "/update_weights_from_disk", Note: "POST {\"model_path\":...} after a deep park", Source: ref + "§2.2; python/sglang/srt/entrypoints/http_server.py (commit 0025436e)"},
		{Key: "flush", Value: "/flush_cache", Note: "POST after a resume", Source: ref + "§2.2; python/sglang/srt/entrypoints/http_server.py (commit 0025436e)"},
	},
	Levels: []Fact{
		{Value: "release with --enable-weights-cpu-backup", Note: "weights kept in host memory: host_backed", Source: ref + "§2.1, §2.4 note 3 (--enable-weights-cpu-backup help)"},
		{Value: "release without a CPU backup", Note: "weights reloaded from disk on resume: deep", Source: ref + "§2.4 note 3"},
	},
	Abort: []Fact{
		{Key: "abort", Value: "/abort_request", Note: "POST {\"rid\":\"<id>\"}; the rid is set on the chat request", Source: ref + "§2.2; python/sglang/srt/entrypoints/http_server.py (commit 0025436e)"},
		{Value: "close the connection", Note: "the tokenizer manager aborts a disconnected request", Source: ref + "§2.4 note 1 (TokenizerManager._wait_one_response)"},
	},
	Metrics: Metrics{
		Running: Fact{Value: "sglang:num_running_reqs", Note: "needs --enable-metrics", Source: ref + "§2.3"},
		Waiting: Fact{Value: "sglang:num_queue_reqs", Source: ref + "§2.3"},
		KVUsage: []Fact{{Value: "sglang:token_usage", Source: ref + "§2.3"}},
		Figures: []Fact{
			{Value: "sglang:prompt_tokens_total", Source: ref + "§2.3"},
			{Value: "sglang:generation_tokens_total", Source: ref + "§2.3"},
			{Value: "sglang:num_used_tokens", Source: ref + "§2.3"},
			{Value: "sglang:gen_throughput", Source: ref + "§2.3"},
			{Value: "sglang:cache_hit_rate", Source: ref + "§2.3"},
		},
	},
	OpenPrefixes: []Fact{
		{Value: "/health", Source: sglangAuth},
		{Value: "/metrics", Source: sglangAuth},
		{Value: "/ready", Note: "newer releases", Source: sglangAuth},
	},
	OpenRoutes: []Fact{
		{Value: "/health", Source: sglangAuth},
		{Value: "/health_generate", Note: "runs a one-token generation", Source: sglangAuth},
		{Value: "/metrics", Source: sglangAuth},
		{Value: "/ready", Note: "newer releases", Source: sglangAuth},
	},
	Env: []Fact{pythonHashSeed, ncclNet},
	APIRoutes: []Fact{
		{Value: "/v1/responses", Note: "not used: translated to chat, whose rid CapyCTL aborts SGLang requests by (whether this route takes the rid is UNCONFIRMED); it also keeps responses in the engine's memory", Source: "v1_responses_request in python/sglang/srt/entrypoints/http_server.py (commit 0025436e)"},
		{Value: "/v1/messages", Note: "not used: its conversion builds the chat request without the client's rid, so CapyCTL's abort by rid would miss the work; translated to chat (the release that adds the route is UNCONFIRMED)", Source: "python/sglang/srt/entrypoints/anthropic/serving.py (commit 0198d48d)"},
		{Value: "/v1/tokenize", Note: "tokenizes a prompt string, without the chat template or tools: count_tokens answers count_tokens_unsupported", Source: "python/sglang/srt/entrypoints/openai/serving_tokenize.py; http_server.py (commit 0025436e)"},
	},
}

// sglangAuth is where SGLang decides which paths need its key.
const sglangAuth = "decide_request_auth in python/sglang/srt/utils/auth.py (older: add_api_key_middleware in python/sglang/srt/utils.py)"

// LlamaCpp is llama.cpp's (llama-server's) table.
var LlamaCpp = &Engine{
	Family:   "llamacpp",
	Name:     "llama.cpp",
	Versions: "every llama-server build (builds are not a verified list)",
	Abort: []Fact{
		{Value: "close the connection", Note: "the slot's task is cancelled within about a second", Source: ref + "§3.6"},
	},
	Metrics: Metrics{
		Running: Fact{Value: "llamacpp:requests_processing", Note: "needs --metrics; no labels", Source: ref + "§3.5"},
		Waiting: Fact{Value: "llamacpp:requests_deferred", Source: ref + "§3.5"},
		// Builds of the Nov-2025 layout serve no KV usage (the driver then
		// reports it unknown); older ones do.
		KVUsage: []Fact{{Value: "llamacpp:kv_cache_usage_ratio", Note: "older builds only: served up to early 2025 (examples/server/server.cpp at c392e509), gone from the Nov-2025 handler; current builds report no KV usage",
			Source: ref + "§3.5"}},
		Figures: []Fact{
			{Value: "llamacpp:prompt_tokens_total", Source: ref + "§3.5"},
			{Value: "llamacpp:tokens_predicted_total", Source: ref + "§3.5"},
			{Value: "llamacpp:prompt_tokens_seconds", Source: ref + "§3.5"},
			{Value: "llamacpp:predicted_tokens_seconds", Source: ref + "§3.5"},
		},
	},
	OpenRoutes: []Fact{
		{Value: "/health", Source: llamaAuth},
		{Value: "/v1/health", Source: llamaAuth},
		{Value: "/models", Source: llamaAuth},
		{Value: "/v1/models", Source: llamaAuth},
		{Value: "/api/tags", Note: "older builds", Source: llamaAuth},
		{Value: "/", Note: "the web UI, which CapyCTL turns off", Source: llamaAuth},
	},
	APIRoutes: []Fact{
		{Key: RouteCountTokens, Value: "/v1/messages/count_tokens", Since: "builds with llama.cpp PR #17570 (November 2025)", Note: "native: counts through the chat template; an older build answers 404, which CapyCTL answers count_tokens_unsupported", Source: ref + "§3.2; ggml-org/llama.cpp pull request #17570"},
		{Value: "/v1/messages", Since: "builds with llama.cpp PR #17570 (November 2025)", Note: "not used: a build number does not tell CapyCTL whether the build has it (older builds answer 404); translated to chat, as llama-server's own conversion does", Source: ref + "§3.2; ggml-org/llama.cpp pull request #17570"},
		{Value: "/tokenize", Note: "tokenizes content text without the chat template (/apply-template renders one): not used", Source: ref + "§3.2"},
	},
}

// llamaAuth is where llama-server lists its public endpoints.
const llamaAuth = "get_public_endpoints in tools/server/server-http.cpp; " + ref + "§3.4"

// tfMetrics: no reference documents TensorFold's /metrics, and the driver
// reads /health for its idle signal instead.
const tfMetrics = "unconfirmed: no public TensorFold documentation names its metrics; the driver reads /health"

// TensorFold is TensorFold's table. It has no park API (restart only), no
// Prometheus idle signal (the driver reads /health) and no open route:
// with a key set every route needs it, so CapyCTL launches it without one
// on a private loopback port.
var TensorFold = &Engine{
	Family:   "tensorfold",
	Name:     "TensorFold",
	Verified: []string{"0.6.0", "0.6.1", "0.6.2", "0.6.3", "0.6.5", "0.6.6"},
	Versions: "0.6.0 to 0.6.6 (0.6.4 not checked)",
	Abort: []Fact{
		{Value: "close the connection", Note: "whether a non-streamed request stops is undocumented", Source: "nothing documented; the driver declares non_streamed_hangup = STREAM (drivers/tensorfold)"},
	},
	Metrics: Metrics{
		Running: Fact{Value: "tensorfold:requests_running", Note: "the driver reads /health's requests_running and busy instead", Source: tfMetrics},
		Waiting: Fact{Value: "tensorfold:requests_waiting", Source: tfMetrics},
		KVUsage: []Fact{{Value: "tensorfold:kv_cache_usage_ratio", Source: tfMetrics}},
	},
	Env: []Fact{ncclNet},
	APIRoutes: []Fact{
		{Value: "chat only", Note: "Messages and Responses are translated to chat; count_tokens answers count_tokens_unsupported", Source: "nothing documented beyond chat (drivers/tensorfold)"},
	},
}
