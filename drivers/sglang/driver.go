// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package sglang is the driver of SGLang (verified 0.5.20 to 0.5.22): it
// renders `<venv>/bin/python -m sglang.launch_server` on a leased loopback
// port with the served name, the memory the ledger granted, 32 running
// requests, the memory saver when the deployment parks, metrics on, one
// tokenizer worker and SGLANG_PLUGINS naming no plugin; the per-launch key
// reaches SGLang through a private configuration file, never argv. It
// proves readiness with the served name and a real answer (or, for a
// decision model, a complete decision), and fails a launch within seconds
// when SGLang's scheduler dies while loading: it ends the remaining
// processes and removes the shared-memory segments the launch made. It
// parks with release_memory_occupation and wakes with
// resume_memory_occupation, a reload from disk after a deep park, and a
// cache flush; aborts by the request ID ("rid") the router puts in the
// body; and reads the idle signal from /metrics.
//
// A group member (Deployment.group: one model over several machines, one
// rank per machine) runs SGLang's multi-node launch: --tp-size and
// --pp-size over all machines, --nnodes, --node-rank and --dist-init-addr
// (the head's address and rendezvous port); GLOO_SOCKET_IFNAME names the
// interface of the host's peer address; no NCCL_* variable is set; never
// in a network namespace of its own. Groups restart instead of parking
// (restart_only by default; deep and host_backed are refused
// capability_missing:deep_park). The head (rank 0) serves the API; a worker
// serves only SGLang's health check on its loopback port, which is its
// readiness (no canary).
package sglang

import (
	"context"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginefacts"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// Family is this driver's engine family.
const Family = "sglang"

// Module is the module a launch runs.
const Module = "sglang.launch_server"

// VerifiedVersions are the SGLang releases CapyCTL is verified with; others
// run as custom.
var VerifiedVersions = enginefacts.SGLang.Verified

// DecisionsSince is the first SGLang release that serves decision models.
const DecisionsSince = "0.5.22"

// NoPlugins is the SGLANG_PLUGINS selection that names no plugin: SGLang
// loads none.
const NoPlugins = "capyctl-loads-no-plugins"

// decisionsPath is the route of decision models.
const decisionsPath = "/v1/systemone"

// Paths of the engine's API the driver uses, from the engine table.
var (
	releasePath = enginefacts.SGLang.Path("release")
	resumePath  = enginefacts.SGLang.Path("resume")
	reloadPath  = enginefacts.SGLang.Path("reload")
	flushPath   = enginefacts.SGLang.Path("flush")
	abortPath   = enginefacts.SGLang.Path("abort")
)

// RequestIDField is the chat body field SGLang takes a request ID in.
const RequestIDField = "rid"

// configFile is the launch's private SGLang configuration (the key).
const configFile = "capyctl-sglang.yaml"

// canaryPrompt is the fixed prompt whose answer proves readiness and, after
// a wake, that the same model answers the same way.
const canaryPrompt = "Reply with exactly: OK"

// canaryTokens bounds the canary answer.
const canaryTokens = 8

// canaryExtra keeps a thinking model from spending the canary's few tokens
// on its thoughts.
var canaryExtra = map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}}

// schedulerComm is the start of SGLang's scheduler process name
// ("sglang::scheduler", cut to 15 bytes by the kernel).
const schedulerComm = "sglang::sched"

// schedulerDied is what SGLang logs when its scheduler fails.
const schedulerDied = "Scheduler hit an exception"

// shmPrefixes are the names of the shared-memory segments SGLang makes.
var shmPrefixes = []string{"sglang_"}

// configKeys are the keys of engine_config.sglang.
var configKeys = []pyengine.Key{
	{Name: "max_total_tokens", Type: "int", Min: 1, Doc: "tokens of the KV pool (--max-total-tokens); derived from memory.kv_cache otherwise"},
	{Name: "chunked_prefill_size", Type: "int", Min: -1, Doc: "chunked prefill size (--chunked-prefill-size; -1 turns it off)"},
	{Name: "tokenizer_workers", Type: "int", Min: 1, Doc: "tokenizer workers (1 by default: aborts by request ID need one)"},
	{Name: "tool_call_parser", Type: "string", Doc: "auto (by model family), none, or an SGLang tool-call parser"},
	{Name: "reasoning_parser", Type: "string", Doc: "auto (by model family), none, or an SGLang reasoning parser"},
}

// parserNames are SGLang's names of the parsers picked by model family.
var parserNames = pyengine.ParserNames{Qwen3Tool: "qwen25", CoderTool: "qwen3_coder", Reasoning: "qwen3"}

// metricNames are SGLang's idle signal and figures, from the engine table.
var metricNames = enginekit.MetricNamesOf(enginefacts.SGLang.Metrics)

// Driver is the SGLang driver.
type Driver struct {
	// Version is the driver\'s version in Describe: the capyctl build that
	// serves it sets its own (`capyctl driver <family>`); the driver does
	// not import the core to learn it.
	Version string
	reg     *enginekit.Registry[*enginekit.Instance]
	// rdmaDir lists the host's RDMA devices for require_rdma
	// (enginekit.DefaultRDMADir when ""; tests point it elsewhere).
	rdmaDir string
	// netns reports whether this driver can launch in a network namespace
	// of its own (nil: enginekit.NetnsPossible; tests set it).
	netns func() bool
}

// netnsPossible is d.netns, or enginekit.NetnsPossible.
func (d *Driver) netnsPossible() bool {
	if d.netns != nil {
		return d.netns()
	}
	return enginekit.NetnsPossible()
}

var (
	_ sdk.Driver     = (*Driver)(nil)
	_ sdk.ExitWaiter = (*Driver)(nil)
)

// New returns the driver.
func New() *Driver { return &Driver{reg: enginekit.NewRegistry[*enginekit.Instance]()} }

// Describe implements sdk.Driver.
func (d *Driver) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return enginekit.Describe(Family, d.Version, &sdk.Capabilities{
		ParkTiers:      []string{enginekit.ResidencyDeep, enginekit.ResidencyHostBacked},
		APIs:           []string{"chat", "decisions", "embeddings"},
		AbortMode:      sdk.AbortModeRequestID,
		IdleSignal:     true,
		LMCache:        true,
		RequestIDField: RequestIDField,
		Groups:         true,
	}, pyengine.ConfigSchema(Family, configKeys)), nil
}

// Detect implements sdk.Driver: a venv with an sglang distribution, read
// from its *.dist-info without running Python.
func (d *Driver) Detect(_ context.Context, req *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	v, resp, err := pyengine.Detect(req.Path, pyengine.DetectSpec{Family: Family, Dist: "sglang", Verified: VerifiedVersions, Module: Module})
	if err != nil {
		return nil, err
	}
	resp.Notes = []string{"launches " + resp.Program + " -m " + Module + " with SGLANG_PLUGINS=" + NoPlugins + " (no plugin is loaded)"}
	if !resp.Verified {
		resp.Notes = append(resp.Notes, "SGLang "+resp.Version+" is not a verified version (0.5.20 to 0.5.22): it runs as custom")
	}
	if !pyengine.VersionAtLeast(resp.Version, DecisionsSince) {
		resp.Notes = append(resp.Notes, "decision models need SGLang "+DecisionsSince+" or newer")
	}
	if dirs := v.PthDirs("nvidia_cutlass_dsl"); len(dirs) > 0 {
		resp.Notes = append(resp.Notes, "cutlass (nvidia-cutlass-dsl) is added to the engine's path without running its .pth hook")
	}
	return resp, nil
}

// Flags implements sdk.Driver.
func (d *Driver) Flags(context.Context, *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	return Table.Response(), nil
}
