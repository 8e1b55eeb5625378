// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pyengine

import (
	"strconv"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/flags"
	"github.com/capyctl/capyctl/sdk/formats"
)

// What follows renders the plans of the OpenAI-compatible servers started
// as `python -m <module>` (vLLM, SGLang): the parts their command lines and
// answers have in common. Each driver renders its own options between.

// PlanVenv finds the installation's environment for a plan; a missing one
// is refused (engine_not_found) and returns nil.
func PlanVenv(inst *sdk.Installation, r *enginekit.Refusals) *Venv {
	venv, err := FindVenv(inst.Path)
	if err != nil {
		r.Add(sdk.CodeEngineNotFound, "engine", "engine %s: %v", inst.Name, err)
	}
	return venv
}

// Checkpoint is what a plan reads from the model directory and the grant.
type Checkpoint struct {
	// Weights are the bytes of the weight files (WeightsBytes).
	Weights int64
	// HF is the model's config.json; nil when it cannot be read.
	HF *formats.HFConfig
	// KVPerToken is the KV cache one token takes, from config.json and the
	// deployment's KV cache type.
	KVPerToken int64
	// KVBudget is the KV cache granted: the launch's, else the
	// deployment's memory.kv_cache; 0 when neither says.
	KVBudget int64
}

// ReadCheckpoint reads a deployment's checkpoint and KV budget.
func ReadCheckpoint(dep *sdk.Deployment, lctx *sdk.LaunchContext) Checkpoint {
	hf, _ := formats.ReadHFConfig(dep.ModelDir)
	c := Checkpoint{
		Weights:    WeightsBytes(dep.ModelDir),
		HF:         hf,
		KVPerToken: hf.KVBytesPerToken(1, dep.KVCacheDtype),
		KVBudget:   lctx.KVCacheBytes,
	}
	if c.KVBudget <= 0 {
		c.KVBudget = dep.Memory.KVCacheBytes
	}
	return c
}

// FamilyParsers picks the parsers of a deployment (ChooseParsers) from
// engine_config.<family>.tool_call_parser and reasoning_parser, and the
// --tool-call-parser and --reasoning-parser options in extra_args.
func FamilyParsers(dep *sdk.Deployment, cfg FamilyConfig, args []flags.Arg, names ParserNames) Chosen {
	return ChooseParsers(ParserInput{
		ModelDir: dep.ModelDir, API: dep.API, Tool: cfg.String("tool_call_parser"), Reasoning: cfg.String("reasoning_parser"),
		Args: args, ToolOption: "--tool-call-parser", ReasoningOption: "--reasoning-parser",
	}, names)
}

// ServerArgv starts a server's command line: `<python> -m <module>
// <modelOption> <model dir> --served-model-name <name> --host 127.0.0.1`,
// and --port when the port is leased.
func ServerArgv(python, module, modelOption string, dep *sdk.Deployment, lctx *sdk.LaunchContext) []string {
	argv := []string{python, "-m", module,
		modelOption, dep.ModelDir,
		"--served-model-name", dep.ServedName,
		"--host", "127.0.0.1",
	}
	if p := lctx.Port; p > 0 {
		argv = append(argv, "--port", strconv.Itoa(int(p)))
	}
	return argv
}

// OnSocket turns a command line from ServerArgv into one that listens on
// the Unix socket sock instead: --host and --port go, option sock comes.
func OnSocket(argv []string, option, sock string) []string {
	out := make([]string, 0, len(argv))
	for i := 0; i < len(argv); i++ {
		if (argv[i] == "--host" || argv[i] == "--port") && i+1 < len(argv) {
			i++
			continue
		}
		out = append(out, argv[i])
	}
	return append(out, option, sock)
}

// TypedArgs renders the typed fields both servers spell alike: --dtype,
// --quantization and --kv-cache-dtype, each when set.
func TypedArgs(dep *sdk.Deployment) []string {
	var out []string
	for _, o := range []struct{ flag, val string }{
		{"--dtype", dep.Dtype}, {"--quantization", dep.Quantization}, {"--kv-cache-dtype", dep.KVCacheDtype},
	} {
		if o.val != "" {
			out = append(out, o.flag, o.val)
		}
	}
	return out
}

// Rendered is a server's rendered launch.
type Rendered struct {
	// Argv and Env are the command line and environment.
	Argv []string
	Env  map[string]string
	// Checkpoint is what the plan read.
	Checkpoint Checkpoint
	// ContextLength is the context rendered; 0 when the model's own.
	ContextLength int64
	// MaxConcurrent is the running requests rendered.
	MaxConcurrent int
	// Parsers are the parsers chosen.
	Parsers Chosen
	// Residency is the effective residency.
	Residency string
	// Group is the launch's group membership, nil for none: the weights
	// and KV per token in the hints are then this rank's share.
	Group *sdk.Group
}

// Plan answers Plan with a rendered launch: the launch directory as the
// working directory, the memory hints from the checkpoint (the model's own
// context when none is rendered; a group member's share of the weights and
// of the KV per token), the parsers, and the startup and wake timeouts
// derived from the weights.
func (r Rendered) Plan(lctx *sdk.LaunchContext) *sdk.PlanResponse {
	ck := r.Checkpoint
	hints := &sdk.MemoryHints{
		WeightsBytes:          enginekit.GroupShare(ck.Weights, r.Group),
		KVBytesPerToken:       enginekit.GroupShare(ck.KVPerToken, r.Group),
		KVCacheBytes:          ck.KVBudget,
		ContextLength:         r.ContextLength,
		MaxConcurrentRequests: int32(r.MaxConcurrent),
		Source:                enginekit.GroupSource("safetensors+config.json", r.Group),
	}
	if hints.ContextLength <= 0 && ck.HF != nil {
		hints.ContextLength = ck.HF.MaxPositionEmbeddings
	}
	var notes []string
	if r.Group != nil {
		notes = append(notes, enginekit.GroupNote(r.Group))
	}
	return &sdk.PlanResponse{
		Notes:          notes,
		Argv:           r.Argv,
		Env:            r.Env,
		Workdir:        lctx.LaunchDir,
		Hints:          *hints,
		Parsers:        *r.Parsers.Report,
		Residency:      r.Residency,
		StartupTimeout: StartupTimeout(ck.Weights),
		WakeTimeout:    WakeTimeout(ck.Weights, r.Residency),
	}
}

// GroupEnv sets the variables of a group member's environment that CapyCTL
// owns: GLOO_SOCKET_IFNAME, the interface that holds the member's peer
// address (PyTorch's Gloo process groups, which vLLM and SGLang use beside
// NCCL, bind it), when an interface of this host holds it; and, on a host
// with require_rdma, NCCL_NET=IB (enginekit.RDMAEnv), so that NCCL cannot
// fall back to TCP sockets. No other NCCL_* variable is set: NCCL picks its
// interface and, without require_rdma, its transport itself.
func GroupEnv(env enginekit.Env, g *sdk.Group) {
	if g == nil {
		return
	}
	if ifc := enginekit.InterfaceOf(g.PeerAddress); ifc != "" {
		env[enginekit.GlooSocketEnv] = ifc
	}
	enginekit.RDMAEnv(env, g)
}
