// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package tensorfold

import "github.com/capyctl/capyctl/sdk/flags"

// Table is TensorFold's flag policy (reference/original.md §8 and the
// release notes): what CapyCTL renders, what no deployment may set, what
// needs a host's approval, and what passes.
var Table = &flags.Table{Family: Family, Rules: append(optionRules(), envRules()...)}

func optionRules() []flags.Rule {
	owned := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Owned, Reason: reason}
	}
	ownedBy := func(name, field, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Owned, Field: field, Reason: reason}
	}
	reserved := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Reserved, Reason: reason}
	}
	gated := func(name, approval, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Gated, Approval: approval, Reason: reason}
	}
	passed := func(name, reason string) flags.Rule {
		return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Passed, Reason: reason}
	}
	return []flags.Rule{
		owned("--name", "the deployment's public name"),
		owned("--host", "engines listen on 127.0.0.1 only"),
		owned("--port", "the loopback port CapyCTL leased"),
		owned("--backend", "CapyCTL runs TensorFold's CUDA backend"),
		ownedBy("--context", "engine_config.context_length", "rendered from engine_config.context_length (required)"),
		ownedBy("--parallel", "engine_config.max_concurrent_requests", "rendered from engine_config.max_concurrent_requests (8 when undeclared)"),
		ownedBy("--kv-dtype", "engine_config.kv_cache_dtype", "rendered from engine_config.kv_cache_dtype"),
		ownedBy("--max-tokens", "engine_config.tensorfold.max_tokens", "rendered from engine_config.tensorfold.max_tokens"),
		ownedBy("--thinking", "engine_config.tensorfold.thinking", "rendered from engine_config.tensorfold.thinking"),
		owned("--snapshot-dir", "kernel snapshots are not written (--snapshot-dir none)"),
		owned("--no-update-check", "the engine never asks for updates"),
		reserved("--alias", "the served name is the deployment's route"),
		reserved("--api-key", "a key on the engine locks CapyCTL out of its health and metrics"),
		reserved("--api-key-file", "a key on the engine locks CapyCTL out of its health and metrics"),
		reserved("--metrics-open", "the engine's metrics are read by CapyCTL on loopback"),
		reserved("--tp", "group launches are CapyCTL's"),
		reserved("--rank", "group launches are CapyCTL's"),
		reserved("--master", "group launches are CapyCTL's"),
		reserved("--master-port", "group launches are CapyCTL's"),
		gated("--drafter", flags.ApprovePath, "a draft model's weights must lie under a directory the host approved"),
		gated("--lane-kernels", flags.ApproveOption, "custom kernels run code on the card"),
		gated("--vision-urls", flags.ApproveOption, "lets requests make the engine fetch images"),
		passed("--no-drafts", "turns speculative drafts off"),
		passed("--name-priority", "request priorities (ID=background)"),
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
		owned("TENSORFOLD_CUDA_MEMORY_LIMIT_GB", "the engine's cap: the deployment's ready allocation on the card"),
		reserved("TENSORFOLD_API_KEY", "it turns on TensorFold's own authentication and locks CapyCTL out of the engine's health and metrics, whatever the approvals"),
		owned("TENSORFOLD_NO_UPDATE_CHECK", "the engine never asks for updates"),
		owned("TRANSFORMERS_OFFLINE", "models come from the model store; the engine never downloads"),
		owned("TORCH_EXTENSIONS_DIR", "where the kernels TensorFold builds are kept between starts"),
	}
	return append(rules, flags.CommonEnvRules()...)
}
