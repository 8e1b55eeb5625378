// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import "github.com/capyctl/capyctl/sdk/flags"

// Table is vLLM's flag policy (verified versions 0.29 to 0.32). Owned
// options are rendered by CapyCTL; reserved ones are refused in any
// spelling whatever the host approves; gated ones need a named host
// approval; the rest pass unchanged (with accept_extra_args = true).
var Table = &flags.Table{Family: Family, Rules: append(optionRules(), envRules()...)}

func optionRules() []flags.Rule {
	owned := func(name, reason string, aliases ...string) flags.Rule {
		return flags.Rule{Name: name, Aliases: aliases, Kind: flags.Option, Class: flags.Owned, Reason: reason}
	}
	reserved := func(name, reason string, aliases ...string) flags.Rule {
		return flags.Rule{Name: name, Aliases: aliases, Kind: flags.Option, Class: flags.Reserved, Reason: reason}
	}
	gated := func(name, approval, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Gated, Approval: approval, Reason: reason}
	}
	typed := func(name, field, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Passed, Field: field, Reason: reason}
	}
	return []flags.Rule{
		owned("--model", "the model directory CapyCTL resolved and measured"),
		owned("--served-model-name", "the deployment's public name"),
		owned("--host", "engines listen on 127.0.0.1 only"),
		owned("--port", "the loopback port CapyCTL leased"),
		owned("--max-num-seqs", "rendered from engine_config.max_concurrent_requests (32 by default)"),
		owned("--gpu-memory-utilization", "rendered from the memory ledger's grant on the card"),
		owned("--kv-cache-memory-bytes", "rendered from the ledger's KV budget (engine_config.memory.kv_cache)"),
		owned("--enable-sleep-mode", "on when the residency parks (deep, host_backed)"),
		owned("--enable-log-requests", "request logging is off on every launch and cannot be turned on", "--disable-log-requests"),
		owned("--enable-log-outputs", "output logging is off on every launch and cannot be turned on"),
		owned("--safetensors-load-strategy", "rendered from engine_config.vllm.safetensors_load_strategy (eager while parking)"),
		reserved("--api-key", "the per-launch key reaches the engine through VLLM_API_KEY, never the command line"),
		reserved("--config", "a configuration file would bypass this policy"),
		reserved("--middleware", "code loaded into the HTTP server"),
		reserved("--uds", "engines listen on CapyCTL's loopback port"),
		reserved("--root-path", "the router calls the engine's own paths"),
		reserved("--ssl-*", "the engine speaks plain HTTP on loopback; TLS belongs in front of CapyCTL"),
		reserved("--headless", "group launches are CapyCTL's"),
		reserved("--device", "the ledger pins the instance to its card"),
		reserved("--tensor-parallel-size", "one card per instance; groups span machines through topology", "--tp"),
		reserved("--pipeline-parallel-size", "one card per instance; groups span machines through topology", "--pp"),
		reserved("--data-parallel-size", "one card per instance", "--dp"),
		reserved("--data-parallel-*", "data-parallel ranks and addresses are CapyCTL's"),
		reserved("--nnodes", "group launches are CapyCTL's"),
		reserved("--node-rank", "group launches are CapyCTL's"),
		reserved("--master-addr", "group launches are CapyCTL's"),
		reserved("--master-port", "group launches are CapyCTL's"),
		reserved("--distributed-executor-backend", "group launches are CapyCTL's"),
		reserved("--enable-scale-out", "group launches are CapyCTL's"),
		reserved("--cpu-offload-gb", "host RAM is charged by the ledger, not grown by the engine"),
		reserved("--swap-space", "host RAM is charged by the ledger, not grown by the engine"),
		reserved("--revision", "the checkpoint is pinned by its content fingerprint"),
		reserved("--logging-config", "the engine's logging is CapyCTL's (every --logging-config.<field> spelling too)"),
		reserved("--log-level", "the engine's logging is CapyCTL's"),
		reserved("--log-config-file", "the engine's logging is CapyCTL's"),
		reserved("--uvicorn-log-level", "the engine's logging is CapyCTL's"),
		reserved("--disable-uvicorn-access-log", "the engine's logging is CapyCTL's"),
		reserved("--disable-log-stats", "the idle signal and the load figures need the engine's statistics"),
		reserved("--max-log-len", "the engine's logging is CapyCTL's"),
		reserved("--otlp-traces-endpoint", "traces would carry requests off the host"),
		reserved("--collect-detailed-traces", "traces would carry requests off the host"),
		gated("--trust-remote-code", flags.ApproveRemoteCode, "runs code the checkpoint ships"),
		gated("--worker-cls", flags.ApproveOption, "loads code into the engine's workers"),
		gated("--worker-extension-cls", flags.ApproveOption, "loads code into the engine's workers"),
		gated("--logits-processors", flags.ApproveOption, "loads code into the sampler"),
		gated("--tool-parser-plugin", flags.ApproveOption, "loads a parser's code"),
		gated("--reasoning-parser-plugin", flags.ApproveOption, "loads a parser's code"),
		gated("--io-processor-plugin", flags.ApproveOption, "loads a plugin's code"),
		gated("--speculative-config", flags.ApproveOption, "a draft model changes memory and loads weights from elsewhere"),
		gated("--kv-transfer-config", flags.ApproveOption, "a KV connector moves the cache out of the engine"),
		gated("--compilation-config", flags.ApproveOption, "compilation settings change memory and startup"),
		gated("--*-config", flags.ApproveOption, "a configuration object (--watermark-config, --engram-config, ...) needs a named approval"),
		gated("--download-dir", flags.ApprovePath, "names a directory the engine writes"),
		gated("--tokenizer", flags.ApprovePath, "loads files from another directory"),
		gated("--hf-config-path", flags.ApprovePath, "loads files from another directory"),
		gated("--chat-template", flags.ApprovePath, "loads a template file"),
		gated("--lora-modules", flags.ApprovePath, "loads adapter weights from another directory"),
		gated("--allowed-local-media-path", flags.ApprovePath, "lets requests read files on the host"),
		typed("--dtype", "engine_config.dtype", "rendered from engine_config.dtype when set"),
		typed("--quantization", "engine_config.quantization", "rendered from engine_config.quantization when set"),
		typed("--kv-cache-dtype", "engine_config.kv_cache_dtype", "rendered from engine_config.kv_cache_dtype when set"),
		typed("--max-model-len", "engine_config.context_length", "rendered from engine_config.context_length, or fitted to the KV budget"),
		typed("--enforce-eager", "engine_config.cuda_graphs", "rendered when engine_config.cuda_graphs = false"),
		typed("--block-size", "engine_config.vllm.block_size_tokens", "rendered from engine_config.vllm.block_size_tokens when set"),
		typed("--max-num-batched-tokens", "engine_config.vllm.max_num_batched_tokens", "rendered from engine_config.vllm.max_num_batched_tokens when set"),
		typed("--tool-call-parser", "engine_config.vllm.tool_call_parser", "picked by model family; here it wins over auto"),
		typed("--reasoning-parser", "engine_config.vllm.reasoning_parser", "picked by model family; here it wins over auto"),
	}
}

func envRules() []flags.Rule {
	owned := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Env, Class: flags.Owned, Reason: reason}
	}
	reserved := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Env, Class: flags.Reserved, Reason: reason}
	}
	return append([]flags.Rule{
		owned("VLLM_API_KEY", "carries the per-launch key"),
		owned("VLLM_SERVER_DEV_MODE", "set to 1 only when the residency parks: it enables /sleep and /wake_up on loopback"),
		owned("VLLM_DO_NOT_TRACK", `set to 1 so vLLM reports nothing off the host (engine_telemetry = "allow" lifts it)`),
		owned("VLLM_NO_USAGE_STATS", `set to 1 so vLLM sends no usage report (engine_telemetry = "allow" lifts it)`),
		reserved("VLLM_USAGE_STATS_SERVER", "usage reports never leave the host"),
		reserved("VLLM_PORT", "ports are CapyCTL's"),
		reserved("VLLM_HOST_IP", "addresses are CapyCTL's"),
		reserved("VLLM_PLUGINS", "plugins load code into the engine"),
		reserved("VLLM_LOGGING_CONFIG_PATH", "the engine's logging is CapyCTL's"),
		reserved("VLLM_CONFIGURE_LOGGING", "the engine's logging is CapyCTL's"),
		reserved("VLLM_RPC_BASE_PATH", "the engine's sockets live in its launch directory"),
	}, flags.CommonEnvRules()...)
}
