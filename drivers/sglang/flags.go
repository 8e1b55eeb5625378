// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import (
	"github.com/capyctl/capyctl/drivers/internal/rules"
	"github.com/capyctl/capyctl/sdk/flags"
)

// Table is SGLang's flag policy (verified versions 0.5.20 to 0.5.22).
// Options that dump to disk are reserved whatever the host approves, and so
// are the variables that do.
var Table = rules.Table(Family, optionRules, envRules)

// dumps is the reason of the options and variables that dump to disk.
const dumps = "writes engine internals to disk"

// optionRules are SGLang's options.
var optionRules = []flags.Rule{
	rules.Owned("--model-path", "the model directory CapyCTL resolved and measured", "--model"),
	rules.Owned("--served-model-name", "the deployment's public name"),
	rules.Owned("--host", "engines listen on 127.0.0.1 only"),
	rules.Owned("--port", "the loopback port CapyCTL leased"),
	rules.Owned("--max-running-requests", "rendered from engine_config.max_concurrent_requests (32 by default)"),
	rules.Owned("--mem-fraction-static", "rendered from the memory ledger's grant on the card"),
	rules.Owned("--max-total-tokens", "rendered from the KV budget (engine_config.memory.kv_cache or engine_config.sglang.max_total_tokens)"),
	rules.Owned("--enable-memory-saver", "on when the residency parks (release and resume of GPU memory)"),
	rules.Owned("--enable-weights-cpu-backup", "on for host_backed: released weights keep a copy in host RAM"),
	rules.Owned("--enable-metrics", "always on: the idle signal and the load figures come from /metrics"),
	rules.Owned("--tokenizer-worker-num", "rendered from engine_config.sglang.tokenizer_workers (1: aborts by request ID reach the engine)"),
	rules.Reserved("--api-key", "the per-launch key reaches the engine through its private configuration file, never the command line"),
	rules.Reserved("--admin-api-key", "CapyCTL owns the engine's authentication"),
	rules.Reserved("--config", "CapyCTL passes the launch's own configuration file; another would bypass this policy"),
	rules.Reserved("--tokenizer-path", "the tokenizer comes from the model directory CapyCTL measured"),
	rules.Owned("--tp-size", "one card per instance; rendered from topology.tensor_parallel for a group", "--tp", "--tensor-parallel-size"),
	rules.Reserved("--dp-size", "one card per instance", "--dp", "--data-parallel-size"),
	rules.Owned("--pp-size", "one card per instance; rendered from topology.pipeline_parallel for a group", "--pipeline-parallel-size"),
	rules.Reserved("--ep-size", "one card per instance", "--ep", "--expert-parallel-size"),
	rules.Owned("--nnodes", "rendered for a group: the number of placement.hosts"),
	rules.Owned("--node-rank", "rendered for a group: the host's index in placement.hosts"),
	rules.Owned("--dist-init-addr", "rendered for a group: the head host's peer address and rendezvous port"),
	rules.Reserved("--cpu-offload-gb", "host RAM is charged by the ledger, not grown by the engine"),
	rules.Reserved("--grpc-mode", "the router speaks HTTP to the engine"),
	rules.Reserved("--ssl-*", "the engine speaks plain HTTP on loopback; TLS belongs in front of CapyCTL"),
	rules.Reserved("--log-level", "the engine's logging is CapyCTL's"),
	rules.Reserved("--log-level-http", "the engine's logging is CapyCTL's"),
	rules.Reserved("--log-requests", "request logging is off on every launch and cannot be turned on"),
	rules.Reserved("--log-requests-level", "request logging is off on every launch and cannot be turned on"),
	rules.Reserved("--crash-dump-folder", "crash dumps would keep requests on disk"),
	rules.Reserved("--enable-hierarchical-cache", "a host-RAM KV cache the ledger does not charge"),
	rules.Reserved("--hicache-*", "a host-RAM KV cache the ledger does not charge"),
	rules.Owned("--enable-lmcache", "rendered when the instance runs its private LMCache server (lmcache)"),
	rules.Reserved("--lmcache-*", "LMCache runs as CapyCTL's own per-instance server"),
	rules.Reserved("--enable-flexkv", "a KV cache outside the engine the ledger does not charge"),
	rules.Reserved("--quantize-and-serve", "writes a quantized checkpoint"),
	rules.Reserved("--watermark-config", dumps),
	rules.Reserved("--debug-tensor-dump-*", dumps),
	rules.Reserved("--msprobe-dump-config", dumps),
	rules.Reserved("--export-metrics-to-file", dumps),
	rules.Reserved("--export-metrics-to-file-dir", dumps),
	rules.Reserved("--spec-trace-dir", dumps),
	rules.Gated("--trust-remote-code", flags.ApproveRemoteCode, "runs code the checkpoint ships"),
	rules.Gated("--speculative-draft-model-path", flags.ApprovePath, "loads draft weights from another directory"),
	rules.Gated("--custom-weight-loader", flags.ApproveOption, "loads code to read the weights"),
	rules.Gated("--enable-custom-logit-processor", flags.ApproveOption, "lets requests run code in the sampler"),
	rules.Gated("--model-loader-extra-config", flags.ApproveOption, "changes how weights are loaded"),
	rules.Gated("--*-path", flags.ApprovePath, "names a file or directory: it must lie under an approved path"),
	rules.Gated("--*-dir", flags.ApprovePath, "names a directory: it must lie under an approved path"),
	rules.Gated("--*-config", flags.ApproveOption, "a configuration object needs a named approval"),
	rules.Typed("--context-length", "engine_config.context_length", "rendered from engine_config.context_length when set"),
	rules.Typed("--dtype", "engine_config.dtype", "rendered from engine_config.dtype when set"),
	rules.Typed("--quantization", "engine_config.quantization", "rendered from engine_config.quantization when set"),
	rules.Typed("--kv-cache-dtype", "engine_config.kv_cache_dtype", "rendered from engine_config.kv_cache_dtype when set"),
	rules.Typed("--disable-cuda-graph", "engine_config.cuda_graphs", "rendered when engine_config.cuda_graphs = false"),
	rules.Typed("--chunked-prefill-size", "engine_config.sglang.chunked_prefill_size", "rendered from engine_config.sglang.chunked_prefill_size when set"),
	rules.Typed("--tool-call-parser", "engine_config.sglang.tool_call_parser", "picked by model family; here it wins over auto"),
	rules.Typed("--reasoning-parser", "engine_config.sglang.reasoning_parser", "picked by model family; here it wins over auto"),
}

// envRules are SGLang's variables, before the ones every engine shares.
var envRules = []flags.Rule{
	rules.OwnedEnv("LMCACHE_*", "configures the private LMCache server CapyCTL runs per instance (lmcache, lmcache_pool)"),
	rules.OwnedEnv("GLOO_SOCKET_IFNAME", "set for a group member to the interface that holds its host's peer address"),
	rules.OwnedEnv("SGLANG_PLUGINS", "set to capyctl-loads-no-plugins, a selection that names no plugin, so SGLang loads none"),
	rules.ReservedEnv("SGLANG_PLATFORM", "selects a platform plugin: code loaded into the engine"),
	rules.ReservedEnv("SMG_*", "settings of the plugins SGLang 0.5.22 installs, which CapyCTL does not load"),
	rules.ReservedEnv("SGLANG_API_KEY", "CapyCTL owns the engine's authentication"),
	rules.ReservedEnv("DUMPER_*", dumps),
	rules.ReservedEnv("SGLANG_DUMP*", dumps),
	rules.ReservedEnv("SGLANG_KERNEL_API_*", dumps),
	rules.ReservedEnv("SGLANG_CUDA_COREDUMP*", dumps),
	rules.ReservedEnv("SGLANG_TORCH_PROFILER_DIR", dumps),
	rules.ReservedEnv("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", dumps),
}
