// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"fmt"
	"strings"
)

// The fake engines' own facts: every name, route, bound and message a
// fake serves or enforces because its engine does, each with where it was
// read (engine, release or commit, file or URL).
//
// IMPORTANT: these tables are the fakes' and nobody else's. The drivers
// keep theirs in sdk/enginefacts; a fake that read the drivers' table
// could never fail a test when a driver's fact is wrong, so this package
// links nothing of sdk/enginefacts, sdk/enginekit or the drivers
// (core/imports_test.go keeps it so). Where the two tables disagree,
// TestFacts_DriversAgreeWithTheFakes fails and the engines' own sources
// decide which one is wrong.

// Fact is one thing a fake does because its engine does it.
type Fact struct {
	// Value is the fact: a metric name, a path, a release, a message.
	Value string
	// Note says more, in a few words.
	Note string
	// Source is where it was read: the engine, its release or commit,
	// the file or URL.
	Source string
}

// EngineFacts are what one fake engine serves of its engine's surface.
type EngineFacts struct {
	// Engine is the family ("vllm", "sglang", "llamacpp", "tensorfold").
	Engine string
	// Running and Waiting are the request gauges of /metrics.
	Running, Waiting Fact
	// KVUsage is the KV usage gauge (0..1); empty Value when the engine
	// serves none.
	KVUsage Fact
	// Figures are the further samples of /metrics a driver may read.
	Figures []Fact
	// GuardedPrefixes are the path prefixes the engine checks its key on
	// when it guards by prefix (vLLM); every other path is open.
	GuardedPrefixes []Fact
	// OpenPrefixes are the path prefixes it lets through without the key
	// when it exempts by prefix (SGLang).
	OpenPrefixes []Fact
	// OpenRoutes are the exact paths it serves without the key when it
	// exempts by list (llama-server).
	OpenRoutes []Fact
}

// Values returns the facts' values.
func Values(fs []Fact) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Value
	}
	return out
}

// MetricNames are every metric name the fake serves: the gauges, the KV
// usage (when it has one) and the figures.
func (f *EngineFacts) MetricNames() []string {
	out := []string{f.Running.Value, f.Waiting.Value}
	if f.KVUsage.Value != "" {
		out = append(out, f.KVUsage.Value)
	}
	return append(out, Values(f.Figures)...)
}

// Markdown renders the facts as the engine pages show them.
func (f *EngineFacts) Markdown() string {
	var b strings.Builder
	b.WriteString("| fact | value | note | source |\n|---|---|---|---|\n")
	rows := func(what string, fs []Fact) {
		for _, x := range fs {
			if x.Value == "" {
				continue
			}
			fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", what, mdCell(x.Value), mdCell(x.Note), mdCell(x.Source))
		}
	}
	rows("running gauge", []Fact{f.Running})
	rows("waiting gauge", []Fact{f.Waiting})
	rows("KV usage", []Fact{f.KVUsage})
	rows("figure", f.Figures)
	rows("key-guarded prefix", f.GuardedPrefixes)
	rows("key-exempt prefix", f.OpenPrefixes)
	rows("open without the key", f.OpenRoutes)
	return b.String()
}

// BehaviourMarkdown renders the behaviour facts.
func BehaviourMarkdown() string {
	var b strings.Builder
	b.WriteString("| fact | value | note | source |\n|---|---|---|---|\n")
	names := []string{"vLLM takes --uds from", "vLLM's default gpu_memory_utilization", "vLLM's free-memory check", "a vLLM rank that loses a peer",
		"vLLM's model-step timeout", "an SGLang rank that loses a peer", "ports SGLang's head binds after its rendezvous port (DP attention)",
		"NCCL without a fallback", "LMCache's key seed"}
	for i, x := range BehaviourFacts() {
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", names[i], mdCell(x.Value), mdCell(x.Note), mdCell(x.Source))
	}
	return b.String()
}

// mdCell escapes text for a Markdown table cell.
func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// FactsFor returns a family's facts, or nil.
func FactsFor(family string) *EngineFacts {
	for _, f := range []*EngineFacts{&VLLMFacts, &SGLangFacts, &LlamaCppFacts, &TensorFoldFacts} {
		if f.Engine == family {
			return f
		}
	}
	return nil
}

// Sources, named once.
const (
	vllmMetricsSrc  = "vLLM v1 PrometheusStatLogger, vllm/v1/metrics/loggers.py (commit 005a810b; /work/shared/reference/engines.md §1.6)"
	vllmAuthSrc     = "vLLM AuthenticationMiddleware, GUARDED_PREFIX in vllm/entrypoints/serve/middleware/authenticate.py (docs.vllm.ai stable; up to 0.15 only /v1 in openai/api_server.py)"
	sglMetricsSrc   = "SGLang python/sglang/srt/metrics/collector.py; docs.sglang.io references/production_metrics (engines.md §2.3)"
	sglAuthSrc      = "SGLang decide_request_auth, python/sglang/srt/utils/auth.py (older: add_api_key_middleware in python/sglang/srt/utils.py skips /health and /metrics)"
	llamaMetricsSrc = "llama.cpp tools/server get_metrics handler, Nov-2025 layout (engines.md §3.5, read in full)"
	llamaAuthSrc    = "llama.cpp public_endpoints of middleware_validate_api_key, tools/server/server-http.cpp (commit aa6192d3)"
	tfSrc           = "none public: TensorFold documents no /metrics; the fake's own names, which no driver may depend on"
)

// VLLMFacts are the fake vLLM's (0.29 to 0.32).
var VLLMFacts = EngineFacts{
	Engine:  "vllm",
	Running: Fact{Value: "vllm:num_requests_running", Source: vllmMetricsSrc},
	Waiting: Fact{Value: "vllm:num_requests_waiting", Source: vllmMetricsSrc},
	KVUsage: Fact{Value: "vllm:kv_cache_usage_perc", Note: "vllm:gpu_cache_usage_perc is no longer emitted by default (vllm-project/vllm#30041)", Source: vllmMetricsSrc},
	Figures: []Fact{
		{Value: "vllm:num_preemptions_total", Source: vllmMetricsSrc},
		{Value: "vllm:prompt_tokens_total", Source: vllmMetricsSrc},
		{Value: "vllm:generation_tokens_total", Source: vllmMetricsSrc},
		{Value: "vllm:prefix_cache_queries_total", Source: vllmMetricsSrc},
		{Value: "vllm:prefix_cache_hits_total", Source: vllmMetricsSrc},
		{Value: "vllm:request_success_total", Note: "label finished_reason", Source: vllmMetricsSrc},
	},
	GuardedPrefixes: []Fact{
		{Value: "/v1", Source: vllmAuthSrc},
		{Value: "/v2", Note: "0.16 and later", Source: vllmAuthSrc},
		{Value: "/inference", Note: "0.16 and later", Source: vllmAuthSrc},
		{Value: "/cohere", Note: "0.16 and later", Source: vllmAuthSrc},
	},
}

// SGLangFacts are the fake SGLang's (0.5.20 to 0.5.22, --enable-metrics).
var SGLangFacts = EngineFacts{
	Engine:  "sglang",
	Running: Fact{Value: "sglang:num_running_reqs", Source: sglMetricsSrc},
	Waiting: Fact{Value: "sglang:num_queue_reqs", Source: sglMetricsSrc},
	KVUsage: Fact{Value: "sglang:token_usage", Source: sglMetricsSrc},
	Figures: []Fact{
		{Value: "sglang:num_used_tokens", Source: sglMetricsSrc},
		{Value: "sglang:gen_throughput", Source: sglMetricsSrc},
		{Value: "sglang:cache_hit_rate", Source: sglMetricsSrc},
		{Value: "sglang:prompt_tokens_total", Source: sglMetricsSrc},
		{Value: "sglang:generation_tokens_total", Source: sglMetricsSrc},
	},
	OpenPrefixes: []Fact{
		{Value: "/health", Note: "also /health_generate", Source: sglAuthSrc},
		{Value: "/metrics", Source: sglAuthSrc},
		{Value: "/ready", Note: "newer releases", Source: sglAuthSrc},
	},
}

// LlamaCppFacts are the fake llama-server's (a current build, --metrics).
var LlamaCppFacts = EngineFacts{
	Engine:  "llamacpp",
	Running: Fact{Value: "llamacpp:requests_processing", Source: llamaMetricsSrc},
	Waiting: Fact{Value: "llamacpp:requests_deferred", Source: llamaMetricsSrc},
	// KVUsage: none. llamacpp:kv_cache_usage_ratio and kv_cache_tokens were
	// served by builds up to early 2025 (examples/server/server.cpp at
	// ggml-org/llama.cpp c392e509, Feb 2025) and are gone from the
	// handler of the Nov-2025 layout (engines.md §3.5).
	Figures: []Fact{
		{Value: "llamacpp:prompt_tokens_total", Source: llamaMetricsSrc},
		{Value: "llamacpp:prompt_seconds_total", Source: llamaMetricsSrc},
		{Value: "llamacpp:tokens_predicted_total", Source: llamaMetricsSrc},
		{Value: "llamacpp:tokens_predicted_seconds_total", Source: llamaMetricsSrc},
		{Value: "llamacpp:n_decode_total", Source: llamaMetricsSrc},
		{Value: "llamacpp:n_tokens_max", Source: llamaMetricsSrc},
		{Value: "llamacpp:n_busy_slots_per_decode", Source: llamaMetricsSrc},
		{Value: "llamacpp:prompt_tokens_seconds", Source: llamaMetricsSrc},
		{Value: "llamacpp:predicted_tokens_seconds", Source: llamaMetricsSrc},
	},
	OpenRoutes: []Fact{
		{Value: "/health", Source: llamaAuthSrc},
		{Value: "/v1/health", Source: llamaAuthSrc},
		{Value: "/models", Source: llamaAuthSrc},
		{Value: "/v1/models", Source: llamaAuthSrc},
		{Value: "/api/tags", Source: llamaAuthSrc},
		{Value: "/", Note: "the web UI", Source: llamaAuthSrc},
	},
}

// TensorFoldFacts are the fake TensorFold's. No public source names its
// metrics: they are the fake's, and the driver reads /health instead.
var TensorFoldFacts = EngineFacts{
	Engine:  "tensorfold",
	Running: Fact{Value: "tensorfold:requests_running", Source: tfSrc},
	Waiting: Fact{Value: "tensorfold:requests_waiting", Source: tfSrc},
	KVUsage: Fact{Value: "tensorfold:kv_cache_usage_ratio", Source: tfSrc},
	Figures: []Fact{
		{Value: "tensorfold:requests_total", Source: tfSrc},
		{Value: "tensorfold:generation_tokens_total", Source: tfSrc},
	},
}

// What the fakes do, or refuse, because their engines do. Each is used
// where the fake enforces it; BehaviourFacts lists them for the pages and
// the tests.
var (
	// FactVLLMUDS is the first vLLM release that takes --uds.
	FactVLLMUDS = Fact{
		Value:  "0.10.2",
		Note:   "merged in August 2025, so in 0.10.2 (September 2025) at the latest; whether 0.10.1 (18 August) has it is unconfirmed, so the fake refuses it there",
		Source: "vllm-project/vllm#18097 (FrontendArgs.uds in vllm/entrypoints/openai/cli_args.py), listed in vLLM's weekly summaries of 2025-08-09 and 2025-08-15",
	}
	// FactVLLMGPUMemoryUtilization is vLLM's default
	// gpu_memory_utilization when the option is not given.
	FactVLLMGPUMemoryUtilization = Fact{
		Value:  "0.92",
		Note:   "0.9 through the 0.11 series",
		Source: "CacheConfig.gpu_memory_utilization, vllm/config/cache.py (docs.vllm.ai stable: Field(default=0.92, gt=0, le=1))",
	}
	// FactVLLMFreeMemory is vLLM's refusal to start when the card's free
	// memory is below ceil(total × gpu_memory_utilization), whatever
	// --kv-cache-memory-bytes says.
	FactVLLMFreeMemory = Fact{
		Value:  "ValueError: Free memory on device cuda:%d (%.2f/%.2f GiB) on startup is less than desired GPU memory utilization (%v, %.2f GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
		Note:   "checked once, after the engine's CUDA context exists and before any weight loads",
		Source: "request_memory in vllm/v1/worker/utils.py, called by Worker.init_device in vllm/v1/worker/gpu_worker.py",
	}
	// FactVLLMPeerLoss is what a vLLM group does when a rank's machine
	// goes away: nothing, until the next collective.
	FactVLLMPeerLoss = Fact{
		Value: "hang",
		Note: "the head's MultiprocExecutor watches only its own worker processes (start_worker_monitor waits on their sentinels); a headless rank that dies is not seen until " +
			"the next collective, where execute_model gives up after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300) and the engine dies; an idle head keeps answering /health with 200. " +
			"A headless rank whose head is gone waits on its broadcast queue as long",
		Source: "vllm/v1/executor/multiproc_executor.py (start_worker_monitor, collective_rpc); run_headless in vllm/entrypoints/cli/serve.py; VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS in vllm/envs.py",
	}
	// FactVLLMExecuteTimeout is the bound of one model step across ranks.
	FactVLLMExecuteTimeout = Fact{Value: "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=300", Source: "vllm/envs.py"}
	// FactSGLangPeerLoss is what an SGLang group does when a rank's
	// process is killed: every scheduler broadcasts its requests over the
	// TP CPU group (Gloo, TCP) on every loop, so the survivors see the
	// closed connection at once, fail and take their server down.
	FactSGLangPeerLoss = Fact{
		Value:  "exit",
		Note:   "a peer whose machine vanishes without closing its sockets is seen only when Gloo's timeout fires",
		Source: "Scheduler.recv_requests (broadcast_pyobj over tp_cpu_group) in python/sglang/srt/managers/scheduler.py; Gloo's TCP pair reports a closed peer",
	}
	// FactSGLangDPAttentionPorts is how many ZeroMQ ports after
	// --dist-init-addr's port SGLang's head binds with DP attention
	// (port_base = dist_init_port + 1 up to port_base + 5; the rendezvous
	// port itself is torch.distributed's store).
	FactSGLangDPAttentionPorts = Fact{
		Value:  "6",
		Note:   "tokenizer, detokenizer, rpc, metrics, scheduler input and load collector, each checked with wait_port_available (\"Port is already in use\")",
		Source: "PortArgs.init_new in python/sglang/srt/server_args.py (sgl-project/sglang 001067ff)",
	}
	// FactNCCLNet makes NCCL use one network and fail when it has none.
	FactNCCLNet = Fact{
		Value:  "NCCL_NET=IB",
		Note:   "without it NCCL falls back to TCP sockets when no InfiniBand or RoCE device works; with it, ncclNetInit fails with \"Error: network IB not found.\" (ncclInvalidUsage)",
		Source: "NCCL environment variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-net, since 2.10); ncclNetInit in NVIDIA/nccl src/net.cc",
	}
	// FactPythonHashSeed fixes the seed of the prefix hashes LMCache keys
	// its chunks by; unset, each engine process draws its own.
	FactPythonHashSeed = Fact{
		Value: "PYTHONHASHSEED",
		Note: "LMCache's ChunkedTokenDatabase chains chunk keys from vLLM's NONE_HASH, which init_none_hash draws from os.urandom unless PYTHONHASHSEED is set; " +
			"LMCache warns \"Centralized cache sharing detected but PYTHONHASHSEED not set\"",
		Source: "lmcache/v1/token_database.py (LMCache/LMCache 00e744e0); init_none_hash in vllm/v1/core/kv_cache_utils.py; vllm-project/vllm#21161",
	}
)

// BehaviourFacts are the behaviour facts above, for pages and tests.
func BehaviourFacts() []Fact {
	return []Fact{FactVLLMUDS, FactVLLMGPUMemoryUtilization, FactVLLMFreeMemory, FactVLLMPeerLoss, FactVLLMExecuteTimeout,
		FactSGLangPeerLoss, FactSGLangDPAttentionPorts, FactNCCLNet, FactPythonHashSeed}
}
