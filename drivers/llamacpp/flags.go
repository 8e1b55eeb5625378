// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"github.com/capyctl/capyctl/sdk/flags"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// Table is llama-server's flag policy (reference/original.md §8, llama.cpp
// column): what CapyCTL renders, what no deployment may set, what needs a
// host's approval, and what passes unchanged (with accept_extra_args =
// true). Short options are refused by the policy engine: write the long
// form.
var Table = &flags.Table{Family: Family, Rules: append(optionRules(), envRules()...)}

func optionRules() []flags.Rule {
	owned := func(name, reason string, aliases ...string) flags.Rule {
		return flags.Rule{Name: name, Aliases: aliases, Kind: flags.Option, Class: flags.Owned, Reason: reason}
	}
	ownedBy := func(field, name, reason string, aliases ...string) flags.Rule {
		r := owned(name, reason, aliases...)
		r.Field = field
		return r
	}
	reserved := func(name, reason string, aliases ...string) flags.Rule {
		return flags.Rule{Name: name, Aliases: aliases, Kind: flags.Option, Class: flags.Reserved, Reason: reason}
	}
	gatedPath := func(name, reason string, aliases ...string) flags.Rule {
		return flags.Rule{Name: name, Aliases: aliases, Kind: flags.Option, Class: flags.Gated, Approval: flags.ApprovePath, Reason: reason}
	}
	passed := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Passed, Reason: reason}
	}
	return []flags.Rule{
		// Rendered by CapyCTL.
		owned("--model", "CapyCTL loads the deployment's GGUF file (engine_config.llamacpp.gguf_file)"),
		owned("--host", "the engine listens on loopback only"),
		owned("--port", "CapyCTL leases the engine's private port"),
		owned("--alias", "the served name is the deployment's route"),
		ownedBy("engine_config.context_length", "--ctx-size", "rendered as the slot window × slots (engine_config.context_length, max_concurrent_requests)"),
		ownedBy("engine_config.max_concurrent_requests", "--parallel", "the slots are engine_config.max_concurrent_requests"),
		owned("--kv-unified", "every slot keeps its own full window (--no-kv-unified), as the memory is sized"),
		ownedBy("engine_config.llamacpp.n_gpu_layers", "--n-gpu-layers", "engine_config.llamacpp.n_gpu_layers", "--gpu-layers"),
		ownedBy("engine_config.kv_cache_dtype", "--cache-type-k", "engine_config.kv_cache_dtype"),
		ownedBy("engine_config.kv_cache_dtype", "--cache-type-v", "engine_config.kv_cache_dtype"),
		owned("--fit", "CapyCTL sizes the memory; llama-server must not refit it (--fit off)"),
		owned("--cache-ram", "no host-RAM prompt cache beside the sized memory (--cache-ram 0)"),
		owned("--context-shift", "an over-long request is refused, not silently truncated (--no-context-shift)"),
		owned("--metrics", "the idle signal is read from /metrics"),
		owned("--slots", "readiness reads the slots"),
		owned("--offline", "the engine never downloads anything"),
		owned("--webui", "no web UI on the engine port (--no-webui)"),
		ownedBy("engine_config.llamacpp.mmproj_file", "--mmproj", "engine_config.llamacpp.mmproj_file"),
		// Never, whatever the host approves.
		reserved("--api-key", "CapyCTL gives the engine its per-launch key (LLAMA_API_KEY)", "--api-key-file"),
		reserved("--sleep-idle-seconds", "the engine must not release its memory behind the ledger's back"),
		reserved("--models-*", "one model per llama-server; CapyCTL routes between models"),
		reserved("--rpc", "engines run on this host only"),
		reserved("--slot-save-path", "the engine writes nothing outside its launch"),
		reserved("--hf-*", "models come from the model store; the engine never downloads"),
		reserved("--model-url", "models come from the model store; the engine never downloads"),
		reserved("--tools", "the engine runs no tools of its own"),
		reserved("--device", "the memory ledger picks the device (CUDA_VISIBLE_DEVICES)"),
		reserved("--split-mode", "one device per instance"),
		reserved("--tensor-split", "one device per instance"),
		reserved("--main-gpu", "one device per instance"),
		reserved("--embedding", "CapyCTL serves chat and decisions", "--embeddings"),
		reserved("--reranking", "CapyCTL serves chat and decisions", "--rerank"),
		reserved("--pooling", "CapyCTL serves chat and decisions"),
		reserved("--props", "POST /props would change the server's settings behind CapyCTL"),
		reserved("--path", "the engine serves no files"),
		reserved("--ssl-key-file", "the engine speaks plain HTTP on loopback", "--ssl-cert-file"),
		reserved("--log-file", "the engine's output is captured and redacted by CapyCTL"),
		reserved("--help", "not a server option", "--usage"),
		reserved("--version", "not a server option"),
		// With a host approval of the path.
		gatedPath("--model-draft", "a draft model's file must lie under a directory the host approved", "--spec-draft-model"),
		gatedPath("--lora", "adapter files must lie under a directory the host approved", "--lora-scaled"),
		gatedPath("--control-vector", "control vectors must lie under a directory the host approved", "--control-vector-scaled"),
		gatedPath("--chat-template-file", "template files must lie under a directory the host approved"),
		gatedPath("--grammar-file", "grammar files must lie under a directory the host approved"),
		gatedPath("--json-schema-file", "schema files must lie under a directory the host approved"),
		gatedPath("--lookup-cache-static", "lookup caches must lie under a directory the host approved"),
		gatedPath("--lookup-cache-dynamic", "lookup caches must lie under a directory the host approved"),
		gatedPath("--media-path", "media files must lie under a directory the host approved"),
		// Tuning that passes (and anything else not named here).
		passed("--batch-size", "logical batch; decision models want it at the context"),
		passed("--ubatch-size", "physical batch; decision models want it at the context"),
		passed("--threads", "CPU threads"),
		passed("--flash-attn", "attention kernel choice"),
		passed("--jinja", "chat templates from the GGUF file"),
	}
}

func envRules() []flags.Rule {
	owned := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Env, Class: flags.Owned, Reason: reason}
	}
	reserved := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Env, Class: flags.Reserved, Reason: reason}
	}
	rules := []flags.Rule{
		owned(keyEnv, "receives the per-launch key"),
		reserved("LLAMA_ARG_*", "llama-server reads any option from LLAMA_ARG_<NAME>: it would bypass this table"),
		owned("LLAMA_CACHE", "an empty directory of the launch: the engine caches and downloads nothing"),
		owned("XDG_CONFIG_HOME", "an empty directory of the launch: no configuration file is read"),
		owned("XDG_CACHE_HOME", "an empty directory of the launch"),
		reserved("HF_*", "the engine never downloads"),
	}
	return append(rules, flags.CommonEnvRules()...)
}

// flagTable is the table as the Flags RPC returns it.
func flagTable() *pb.FlagsResponse { return Table.Proto() }
