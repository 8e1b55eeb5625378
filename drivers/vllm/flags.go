// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"github.com/capyctl/capyctl/drivers/internal/rules"
	"github.com/capyctl/capyctl/sdk/flags"
)

// Table is vLLM's flag policy (verified versions 0.29 to 0.32). Owned
// options are rendered by CapyCTL; reserved ones are refused in any
// spelling whatever the host approves; gated ones need a named host
// approval; the rest pass unchanged (with accept_extra_args = true).
var Table = rules.Table(Family, optionRules, envRules)

// optionRules are vLLM's options.
var optionRules = []flags.Rule{
	rules.Owned("--model", "the model directory CapyCTL resolved and measured"),
	rules.Owned("--served-model-name", "the deployment's public name"),
	rules.Owned("--host", "engines listen on 127.0.0.1 only"),
	rules.Owned("--port", "the loopback port CapyCTL leased"),
	rules.Owned("--max-num-seqs", "rendered from engine_config.max_concurrent_requests (32 by default)"),
	rules.Owned("--gpu-memory-utilization", "rendered from the memory ledger's grant on the card"),
	rules.Owned("--kv-cache-memory-bytes", "rendered from the ledger's KV budget (engine_config.memory.kv_cache)"),
	rules.Owned("--enable-sleep-mode", "on when the residency parks (deep, host_backed)"),
	rules.Owned("--enable-log-requests", "request logging is off on every launch and cannot be turned on", "--disable-log-requests"),
	rules.Owned("--enable-log-outputs", "output logging is off on every launch and cannot be turned on"),
	rules.Owned("--safetensors-load-strategy", "rendered from engine_config.vllm.safetensors_load_strategy (eager while parking)"),
	rules.Reserved("--api-key", "the per-launch key reaches the engine through VLLM_API_KEY, never the command line"),
	rules.Reserved("--config", "a configuration file would bypass this policy"),
	rules.Reserved("--middleware", "code loaded into the HTTP server"),
	rules.Owned("--uds", "CapyCTL serves the engine on a socket in its launch directory (vLLM 0.11 and later)"),
	rules.Reserved("--root-path", "the router calls the engine's own paths"),
	rules.Reserved("--ssl-*", "the engine speaks plain HTTP on loopback; TLS belongs in front of CapyCTL"),
	rules.Owned("--headless", "rendered on a group's worker ranks (topology and placement.hosts)"),
	rules.Reserved("--device", "the ledger pins the instance to its card"),
	rules.Owned("--tensor-parallel-size", "one card per instance; rendered from topology.tensor_parallel for a group", "--tp"),
	rules.Owned("--pipeline-parallel-size", "one card per instance; rendered from topology.pipeline_parallel for a group", "--pp"),
	rules.Reserved("--data-parallel-size", "one card per instance", "--dp"),
	rules.Reserved("--data-parallel-*", "data-parallel ranks and addresses are CapyCTL's"),
	rules.Owned("--nnodes", "rendered for a group: the number of placement.hosts"),
	rules.Owned("--node-rank", "rendered for a group: the host's index in placement.hosts"),
	rules.Owned("--master-addr", "rendered for a group: the head host's peer address"),
	rules.Owned("--master-port", "rendered for a group: the head host's rendezvous port (rendezvous_ports)"),
	rules.Owned("--distributed-executor-backend", "rendered for a group: mp (one process tree per machine, no Ray cluster)"),
	rules.Reserved("--enable-scale-out", "group launches are CapyCTL's"),
	rules.Reserved("--cpu-offload-gb", "host RAM is charged by the ledger, not grown by the engine"),
	rules.Reserved("--swap-space", "host RAM is charged by the ledger, not grown by the engine"),
	rules.Reserved("--revision", "the checkpoint is pinned by its content fingerprint"),
	rules.Reserved("--logging-config", "the engine's logging is CapyCTL's (every --logging-config.<field> spelling too)"),
	rules.Reserved("--log-level", "the engine's logging is CapyCTL's"),
	rules.Reserved("--log-config-file", "the engine's logging is CapyCTL's"),
	rules.Reserved("--uvicorn-log-level", "the engine's logging is CapyCTL's"),
	rules.Reserved("--disable-uvicorn-access-log", "the engine's logging is CapyCTL's"),
	rules.Reserved("--disable-log-stats", "the idle signal and the load figures need the engine's statistics"),
	rules.Reserved("--max-log-len", "the engine's logging is CapyCTL's"),
	rules.Reserved("--otlp-traces-endpoint", "traces would carry requests off the host"),
	rules.Reserved("--collect-detailed-traces", "traces would carry requests off the host"),
	rules.Gated("--trust-remote-code", flags.ApproveRemoteCode, "runs code the checkpoint ships"),
	rules.Gated("--worker-cls", flags.ApproveOption, "loads code into the engine's workers"),
	rules.Gated("--worker-extension-cls", flags.ApproveOption, "loads code into the engine's workers"),
	rules.Gated("--logits-processors", flags.ApproveOption, "loads code into the sampler"),
	rules.Gated("--tool-parser-plugin", flags.ApproveOption, "loads a parser's code"),
	rules.Gated("--reasoning-parser-plugin", flags.ApproveOption, "loads a parser's code"),
	rules.Gated("--io-processor-plugin", flags.ApproveOption, "loads a plugin's code"),
	rules.Gated("--speculative-config", flags.ApproveOption, "a draft model changes memory and loads weights from elsewhere"),
	rules.Gated("--kv-transfer-config", flags.ApproveOption, "a KV connector moves the cache out of the engine"),
	rules.Gated("--compilation-config", flags.ApproveOption, "compilation settings change memory and startup"),
	rules.Gated("--*-config", flags.ApproveOption, "a configuration object (--watermark-config, --engram-config, ...) needs a named approval"),
	rules.Gated("--download-dir", flags.ApprovePath, "names a directory the engine writes"),
	rules.Gated("--tokenizer", flags.ApprovePath, "loads files from another directory"),
	rules.Gated("--hf-config-path", flags.ApprovePath, "loads files from another directory"),
	rules.Gated("--chat-template", flags.ApprovePath, "loads a template file"),
	rules.Gated("--lora-modules", flags.ApprovePath, "loads adapter weights from another directory"),
	rules.Gated("--allowed-local-media-path", flags.ApprovePath, "lets requests read files on the host"),
	rules.Typed("--dtype", "engine_config.dtype", "rendered from engine_config.dtype when set"),
	rules.Typed("--quantization", "engine_config.quantization", "rendered from engine_config.quantization when set"),
	rules.Typed("--kv-cache-dtype", "engine_config.kv_cache_dtype", "rendered from engine_config.kv_cache_dtype when set"),
	rules.Typed("--max-model-len", "engine_config.context_length", "rendered from engine_config.context_length, or fitted to the KV budget"),
	rules.Typed("--enforce-eager", "engine_config.cuda_graphs", "rendered when engine_config.cuda_graphs = false"),
	rules.Typed("--block-size", "engine_config.vllm.block_size_tokens", "rendered from engine_config.vllm.block_size_tokens when set"),
	rules.Typed("--max-num-batched-tokens", "engine_config.vllm.max_num_batched_tokens", "rendered from engine_config.vllm.max_num_batched_tokens when set"),
	rules.Typed("--tool-call-parser", "engine_config.vllm.tool_call_parser", "picked by model family; here it wins over auto"),
	rules.Typed("--reasoning-parser", "engine_config.vllm.reasoning_parser", "picked by model family; here it wins over auto"),
}

// envRules are vLLM's variables, before the ones every engine shares.
var envRules = []flags.Rule{
	rules.OwnedEnv("LMCACHE_*", "configures the private LMCache server CapyCTL runs per instance (lmcache, lmcache_pool)"),
	rules.OwnedEnv("VLLM_API_KEY", "carries the per-launch key"),
	rules.OwnedEnv("VLLM_SERVER_DEV_MODE", "set to 1 only when the residency parks: it enables /sleep and /wake_up on loopback"),
	rules.OwnedEnv("VLLM_DO_NOT_TRACK", `set to 1 so vLLM reports nothing off the host (engine_telemetry = "allow" lifts it)`),
	rules.OwnedEnv("VLLM_NO_USAGE_STATS", `set to 1 so vLLM sends no usage report (engine_telemetry = "allow" lifts it)`),
	rules.ReservedEnv("VLLM_USAGE_STATS_SERVER", "usage reports never leave the host"),
	rules.ReservedEnv("VLLM_PORT", "ports are CapyCTL's"),
	rules.OwnedEnv("VLLM_HOST_IP", "set for a group member to its host's peer address"),
	rules.OwnedEnv("GLOO_SOCKET_IFNAME", "set for a group member to the interface that holds its host's peer address"),
	rules.ReservedEnv("VLLM_PLUGINS", "plugins load code into the engine"),
	rules.ReservedEnv("VLLM_LOGGING_CONFIG_PATH", "the engine's logging is CapyCTL's"),
	rules.ReservedEnv("VLLM_CONFIGURE_LOGGING", "the engine's logging is CapyCTL's"),
	rules.ReservedEnv("VLLM_RPC_BASE_PATH", "the engine's sockets live in its launch directory"),
}
