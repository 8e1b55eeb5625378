// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package flags

// CommonEnvRules are the environment names every engine family treats
// alike: what CapyCTL sets for every engine, what would change which code
// runs or where it reports, and the few names any deployment may set. A
// driver appends them to its own rows (its own rows are more specific and
// win).
func CommonEnvRules() []Rule {
	owned := func(name, reason string) Rule {
		return Rule{Name: name, Kind: Env, Class: Owned, Reason: reason}
	}
	reserved := func(name, reason string) Rule {
		return Rule{Name: name, Kind: Env, Class: Reserved, Reason: reason}
	}
	passed := func(name, reason string) Rule {
		return Rule{Name: name, Kind: Env, Class: Passed, Reason: reason}
	}
	return []Rule{
		owned("DO_NOT_TRACK", `set to 1 so the engine reports nothing off the host (the host's engine_telemetry = "allow" lifts it)`),
		owned("PATH", "the engine runs with a closed PATH: its installation's bin, the CUDA toolkit's, and the system's"),
		owned("HOME", "the engine's home is its private launch directory"),
		owned("CUDA_VISIBLE_DEVICES", "the memory ledger pins the instance to its card"),
		owned("CUDA_DEVICE_ORDER", "set with CUDA_VISIBLE_DEVICES so device indexes follow the PCI bus"),
		owned("CUDA_HOME", "the host's CUDA toolkit, detected when the engine was added"),
		owned("HF_HUB_OFFLINE", "models come from the model store; the engine never downloads"),
		reserved("CAPYCTL_*", "CapyCTL's own variables"),
		reserved("LD_*", "dynamic-loader variables change which code runs"),
		reserved("PYTHON*", "interpreter variables change which code runs (PYTHONUNBUFFERED excepted)"),
		reserved("NCCL_*", "collective-communication settings belong to CapyCTL's group launches"),
		reserved("GLOO_*", "collective-communication settings belong to CapyCTL's group launches"),
		reserved("MASTER_*", "rendezvous settings belong to CapyCTL's group launches"),
		passed("PYTHONUNBUFFERED", "only changes when the engine's output is flushed"),
		passed("RUST_LOG", "log level of the engine's Rust components"),
		passed("TOKENIZERS_PARALLELISM", "tokenizer threading"),
		passed("MAX_JOBS", "parallelism of kernel builds"),
		passed("FLASHINFER_NVCC_THREADS", "parallelism of FlashInfer kernel builds"),
	}
}
