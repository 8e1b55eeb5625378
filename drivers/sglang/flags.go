// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import "github.com/capyctl/capyctl/sdk/flags"

// Table is SGLang's flag policy (verified versions 0.5.20 to 0.5.22).
// Options that dump to disk are reserved whatever the host approves, and so
// are the variables that do.
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
	const dumps = "writes engine internals to disk"
	return []flags.Rule{
		owned("--model-path", "the model directory CapyCTL resolved and measured", "--model"),
		owned("--served-model-name", "the deployment's public name"),
		owned("--host", "engines listen on 127.0.0.1 only"),
		owned("--port", "the loopback port CapyCTL leased"),
		owned("--max-running-requests", "rendered from engine_config.max_concurrent_requests (32 by default)"),
		owned("--mem-fraction-static", "rendered from the memory ledger's grant on the card"),
		owned("--max-total-tokens", "rendered from the KV budget (engine_config.memory.kv_cache or engine_config.sglang.max_total_tokens)"),
		owned("--enable-memory-saver", "on when the residency parks (release and resume of GPU memory)"),
		owned("--enable-weights-cpu-backup", "on for host_backed: released weights keep a copy in host RAM"),
		owned("--enable-metrics", "always on: the idle signal and the load figures come from /metrics"),
		owned("--tokenizer-worker-num", "rendered from engine_config.sglang.tokenizer_workers (1: aborts by request ID reach the engine)"),
		reserved("--api-key", "the per-launch key reaches the engine through its private configuration file, never the command line"),
		reserved("--admin-api-key", "CapyCTL owns the engine's authentication"),
		reserved("--config", "CapyCTL passes the launch's own configuration file; another would bypass this policy"),
		reserved("--tokenizer-path", "the tokenizer comes from the model directory CapyCTL measured"),
		reserved("--tp-size", "one card per instance; groups span machines through topology", "--tp", "--tensor-parallel-size"),
		reserved("--dp-size", "one card per instance", "--dp", "--data-parallel-size"),
		reserved("--pp-size", "one card per instance; groups span machines through topology", "--pipeline-parallel-size"),
		reserved("--ep-size", "one card per instance", "--ep", "--expert-parallel-size"),
		reserved("--nnodes", "group launches are CapyCTL's"),
		reserved("--node-rank", "group launches are CapyCTL's"),
		reserved("--dist-init-addr", "group launches are CapyCTL's"),
		reserved("--cpu-offload-gb", "host RAM is charged by the ledger, not grown by the engine"),
		reserved("--grpc-mode", "the router speaks HTTP to the engine"),
		reserved("--ssl-*", "the engine speaks plain HTTP on loopback; TLS belongs in front of CapyCTL"),
		reserved("--log-level", "the engine's logging is CapyCTL's"),
		reserved("--log-level-http", "the engine's logging is CapyCTL's"),
		reserved("--log-requests", "request logging is off on every launch and cannot be turned on"),
		reserved("--log-requests-level", "request logging is off on every launch and cannot be turned on"),
		reserved("--crash-dump-folder", "crash dumps would keep requests on disk"),
		reserved("--enable-hierarchical-cache", "a host-RAM KV cache the ledger does not charge"),
		reserved("--hicache-*", "a host-RAM KV cache the ledger does not charge"),
		reserved("--enable-lmcache", "LMCache runs as CapyCTL's own per-instance server"),
		reserved("--lmcache-*", "LMCache runs as CapyCTL's own per-instance server"),
		reserved("--enable-flexkv", "a KV cache outside the engine the ledger does not charge"),
		reserved("--quantize-and-serve", "writes a quantized checkpoint"),
		reserved("--watermark-config", dumps),
		reserved("--debug-tensor-dump-*", dumps),
		reserved("--msprobe-dump-config", dumps),
		reserved("--export-metrics-to-file", dumps),
		reserved("--export-metrics-to-file-dir", dumps),
		reserved("--spec-trace-dir", dumps),
		gated("--trust-remote-code", flags.ApproveRemoteCode, "runs code the checkpoint ships"),
		gated("--speculative-draft-model-path", flags.ApprovePath, "loads draft weights from another directory"),
		gated("--custom-weight-loader", flags.ApproveOption, "loads code to read the weights"),
		gated("--enable-custom-logit-processor", flags.ApproveOption, "lets requests run code in the sampler"),
		gated("--model-loader-extra-config", flags.ApproveOption, "changes how weights are loaded"),
		gated("--*-path", flags.ApprovePath, "names a file or directory: it must lie under an approved path"),
		gated("--*-dir", flags.ApprovePath, "names a directory: it must lie under an approved path"),
		gated("--*-config", flags.ApproveOption, "a configuration object needs a named approval"),
		typed("--context-length", "engine_config.context_length", "rendered from engine_config.context_length when set"),
		typed("--dtype", "engine_config.dtype", "rendered from engine_config.dtype when set"),
		typed("--quantization", "engine_config.quantization", "rendered from engine_config.quantization when set"),
		typed("--kv-cache-dtype", "engine_config.kv_cache_dtype", "rendered from engine_config.kv_cache_dtype when set"),
		typed("--disable-cuda-graph", "engine_config.cuda_graphs", "rendered when engine_config.cuda_graphs = false"),
		typed("--chunked-prefill-size", "engine_config.sglang.chunked_prefill_size", "rendered from engine_config.sglang.chunked_prefill_size when set"),
		typed("--tool-call-parser", "engine_config.sglang.tool_call_parser", "picked by model family; here it wins over auto"),
		typed("--reasoning-parser", "engine_config.sglang.reasoning_parser", "picked by model family; here it wins over auto"),
	}
}

func envRules() []flags.Rule {
	owned := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Env, Class: flags.Owned, Reason: reason}
	}
	reserved := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Env, Class: flags.Reserved, Reason: reason}
	}
	const dumps = "writes engine internals to disk"
	return append([]flags.Rule{
		owned("SGLANG_PLUGINS", "set to capyctl-loads-no-plugins, a selection that names no plugin, so SGLang loads none"),
		reserved("SGLANG_PLATFORM", "selects a platform plugin: code loaded into the engine"),
		reserved("SMG_*", "settings of the plugins SGLang 0.5.22 installs, which CapyCTL does not load"),
		reserved("SGLANG_API_KEY", "CapyCTL owns the engine's authentication"),
		reserved("DUMPER_*", dumps),
		reserved("SGLANG_DUMP*", dumps),
		reserved("SGLANG_KERNEL_API_*", dumps),
		reserved("SGLANG_CUDA_COREDUMP*", dumps),
		reserved("SGLANG_TORCH_PROFILER_DIR", dumps),
		reserved("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", dumps),
	}, flags.CommonEnvRules()...)
}
