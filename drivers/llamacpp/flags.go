// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"github.com/capyctl/capyctl/drivers/internal/rules"
	"github.com/capyctl/capyctl/sdk/flags"
)

// Table is llama-server's flag policy (reference/original.md §8, llama.cpp
// column): what CapyCTL renders, what no deployment may set, what needs a
// host's approval, and what passes unchanged (with accept_extra_args =
// true). Short options are refused by the policy engine: write the long
// form.
var Table = rules.Table(Family, optionRules, envRules)

// optionRules are llama-server's options.
var optionRules = []flags.Rule{
	// Rendered by CapyCTL.
	rules.Owned("--model", "CapyCTL loads the deployment's GGUF file (engine_config.llamacpp.gguf_file)"),
	rules.Owned("--host", "the engine listens on loopback only, or on a socket in its launch directory where the build binds one"),
	rules.Owned("--port", "CapyCTL leases the engine's private port"),
	rules.Owned("--alias", "the served name is the deployment's route"),
	rules.OwnedBy("--ctx-size", "engine_config.context_length", "rendered as the slot window × slots (engine_config.context_length, max_concurrent_requests)"),
	rules.OwnedBy("--parallel", "engine_config.max_concurrent_requests", "the slots are engine_config.max_concurrent_requests"),
	rules.Owned("--kv-unified", "every slot keeps its own full window (--no-kv-unified), as the memory is sized"),
	rules.OwnedBy("--n-gpu-layers", "engine_config.llamacpp.n_gpu_layers", "engine_config.llamacpp.n_gpu_layers", "--gpu-layers"),
	rules.OwnedBy("--cache-type-k", "engine_config.kv_cache_dtype", "engine_config.kv_cache_dtype"),
	rules.OwnedBy("--cache-type-v", "engine_config.kv_cache_dtype", "engine_config.kv_cache_dtype"),
	rules.Owned("--fit", "CapyCTL sizes the memory; llama-server must not refit it (--fit off)"),
	rules.Owned("--cache-ram", "no host-RAM prompt cache beside the sized memory (--cache-ram 0)"),
	rules.Owned("--context-shift", "an over-long request is refused, not silently truncated (--no-context-shift)"),
	rules.Owned("--metrics", "the idle signal is read from /metrics"),
	rules.Owned("--slots", "readiness reads the slots"),
	rules.Owned("--offline", "the engine never downloads anything"),
	rules.Owned("--webui", "no web UI on the engine port (--no-webui)"),
	rules.OwnedBy("--mmproj", "engine_config.llamacpp.mmproj_file", "engine_config.llamacpp.mmproj_file"),
	// Never, whatever the host approves.
	rules.Reserved("--api-key", "CapyCTL gives the engine its per-launch key (LLAMA_API_KEY)", "--api-key-file"),
	rules.Reserved("--sleep-idle-seconds", "the engine must not release its memory behind the ledger's back"),
	rules.Reserved("--models-*", "one model per llama-server; CapyCTL routes between models"),
	rules.Reserved("--rpc", "engines run on this host only"),
	rules.Reserved("--slot-save-path", "the engine writes nothing outside its launch"),
	rules.Reserved("--hf-*", "models come from the model store; the engine never downloads"),
	rules.Reserved("--model-url", "models come from the model store; the engine never downloads"),
	rules.Reserved("--tools", "the engine runs no tools of its own"),
	rules.Reserved("--device", "the memory ledger picks the device (CUDA_VISIBLE_DEVICES)"),
	rules.Reserved("--split-mode", "one device per instance"),
	rules.Reserved("--tensor-split", "one device per instance"),
	rules.Reserved("--main-gpu", "one device per instance"),
	rules.Reserved("--embedding", "CapyCTL serves chat and decisions", "--embeddings"),
	rules.Reserved("--reranking", "CapyCTL renders it for api = \"rerank\"", "--rerank"),
	rules.Reserved("--pooling", "CapyCTL serves chat and decisions"),
	rules.Reserved("--props", "POST /props would change the server's settings behind CapyCTL"),
	rules.Reserved("--path", "the engine serves no files"),
	rules.Reserved("--ssl-key-file", "the engine speaks plain HTTP on loopback", "--ssl-cert-file"),
	rules.Reserved("--log-file", "the engine's output is captured and redacted by CapyCTL"),
	rules.Reserved("--help", "not a server option", "--usage"),
	rules.Reserved("--version", "not a server option"),
	// With a host approval of the path.
	rules.Gated("--model-draft", flags.ApprovePath, "a draft model's file must lie under a directory the host approved", "--spec-draft-model"),
	rules.Gated("--lora", flags.ApprovePath, "adapter files must lie under a directory the host approved", "--lora-scaled"),
	rules.Gated("--control-vector", flags.ApprovePath, "control vectors must lie under a directory the host approved", "--control-vector-scaled"),
	rules.Gated("--chat-template-file", flags.ApprovePath, "template files must lie under a directory the host approved"),
	rules.Gated("--grammar-file", flags.ApprovePath, "grammar files must lie under a directory the host approved"),
	rules.Gated("--json-schema-file", flags.ApprovePath, "schema files must lie under a directory the host approved"),
	rules.Gated("--lookup-cache-static", flags.ApprovePath, "lookup caches must lie under a directory the host approved"),
	rules.Gated("--lookup-cache-dynamic", flags.ApprovePath, "lookup caches must lie under a directory the host approved"),
	rules.Gated("--media-path", flags.ApprovePath, "media files must lie under a directory the host approved"),
	// Tuning that passes (and anything else not named here).
	rules.Passed("--batch-size", "logical batch; decision models want it at the context"),
	rules.Passed("--ubatch-size", "physical batch; decision models want it at the context"),
	rules.Passed("--threads", "CPU threads"),
	rules.Passed("--flash-attn", "attention kernel choice"),
	rules.Passed("--jinja", "chat templates from the GGUF file"),
}

// envRules are llama-server's variables, before the ones every engine shares.
var envRules = []flags.Rule{
	rules.OwnedEnv(keyEnv, "receives the per-launch key"),
	rules.ReservedEnv("LLAMA_ARG_*", "llama-server reads any option from LLAMA_ARG_<NAME>: it would bypass this table"),
	rules.OwnedEnv("LLAMA_CACHE", "an empty directory of the launch: the engine caches and downloads nothing"),
	rules.OwnedEnv("XDG_CONFIG_HOME", "an empty directory of the launch: no configuration file is read"),
	rules.OwnedEnv("XDG_CACHE_HOME", "an empty directory of the launch"),
	rules.ReservedEnv("HF_*", "the engine never downloads"),
}
