// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package tensorfold

import (
	"github.com/capyctl/capyctl/drivers/internal/rules"
	"github.com/capyctl/capyctl/sdk/flags"
)

// Table is TensorFold's flag policy (reference/original.md §8 and the
// release notes): what CapyCTL renders, what no deployment may set, what
// needs a host's approval, and what passes.
var Table = rules.Table(Family, optionRules, envRules)

// optionRules are TensorFold's options.
var optionRules = []flags.Rule{
	rules.Owned("--name", "the deployment's public name"),
	rules.Owned("--host", "engines listen on 127.0.0.1 only"),
	rules.Owned("--port", "the loopback port CapyCTL leased"),
	rules.Owned("--backend", "CapyCTL runs TensorFold's CUDA backend"),
	rules.OwnedBy("--context", "engine_config.context_length", "rendered from engine_config.context_length (required)"),
	rules.OwnedBy("--parallel", "engine_config.max_concurrent_requests", "rendered from engine_config.max_concurrent_requests (8 when undeclared)"),
	rules.OwnedBy("--kv-dtype", "engine_config.kv_cache_dtype", "rendered from engine_config.kv_cache_dtype"),
	rules.OwnedBy("--max-tokens", "engine_config.tensorfold.max_tokens", "rendered from engine_config.tensorfold.max_tokens"),
	rules.OwnedBy("--thinking", "engine_config.tensorfold.thinking", "rendered from engine_config.tensorfold.thinking"),
	rules.Owned("--snapshot-dir", "kernel snapshots are not written (--snapshot-dir none)"),
	rules.Owned("--no-update-check", "the engine never asks for updates"),
	rules.Reserved("--alias", "the served name is the deployment's route"),
	rules.Reserved("--api-key", "a key on the engine locks CapyCTL out of its health and metrics"),
	rules.Reserved("--api-key-file", "a key on the engine locks CapyCTL out of its health and metrics"),
	rules.Reserved("--metrics-open", "the engine's metrics are read by CapyCTL on loopback"),
	rules.Owned("--tp", "rendered for a two-machine group (topology tensor_parallel = 2)"),
	rules.Owned("--rank", "rendered for a group: the host's index in placement.hosts"),
	rules.Owned("--master", "rendered for a group: the head host's peer address"),
	rules.Owned("--master-port", "rendered for a group: the head host's rendezvous port (rendezvous_ports)"),
	rules.Gated("--drafter", flags.ApprovePath, "a draft model's weights must lie under a directory the host approved"),
	rules.Gated("--lane-kernels", flags.ApproveOption, "custom kernels run code on the card"),
	rules.Gated("--vision-urls", flags.ApproveOption, "lets requests make the engine fetch images"),
	rules.Passed("--no-drafts", "turns speculative drafts off"),
	rules.Passed("--name-priority", "request priorities (ID=background)"),
}

// envRules are TensorFold's variables, before the ones every engine shares.
var envRules = []flags.Rule{
	rules.OwnedEnv("TENSORFOLD_CUDA_MEMORY_LIMIT_GB", "the engine's cap: the deployment's ready allocation on the card"),
	rules.ReservedEnv("TENSORFOLD_API_KEY", "it turns on TensorFold's own authentication and locks CapyCTL out of the engine's health and metrics, whatever the approvals"),
	rules.OwnedEnv("GLOO_SOCKET_IFNAME", "set for a group member to the interface that holds its host's peer address"),
	rules.OwnedEnv("TENSORFOLD_NO_UPDATE_CHECK", "the engine never asks for updates"),
	rules.OwnedEnv("TRANSFORMERS_OFFLINE", "models come from the model store; the engine never downloads"),
	rules.OwnedEnv("TORCH_EXTENSIONS_DIR", "where the kernels TensorFold builds are kept between starts"),
}
