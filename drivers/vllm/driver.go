// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package vllm is the driver of vLLM (verified 0.29 to 0.32): it renders
// `<venv>/bin/python -m vllm.entrypoints.openai.api_server` on a leased
// loopback port with the served name, the memory the ledger granted, 32
// running requests, sleep mode when the deployment parks and request
// logging off; it polices options and variables with its flag table;
// proves readiness with the served name and a real answer; parks with
// POST /sleep (level 2 deep, level 1 host_backed) and wakes with /wake_up,
// a weight reload after a deep park, a prefix-cache reset and the wake
// canary; reads the idle signal from /metrics; and aborts by closing the
// connection. vLLM serves chat only: decision deployments are refused
// (capability_missing:decisions).
//
// A group member (Deployment.group: one model over several machines, one
// rank per machine) runs vLLM's multiprocessing multi-node launch:
// --tensor-parallel-size and --pipeline-parallel-size over all machines,
// --distributed-executor-backend mp, --nnodes, --node-rank, --master-addr
// and --master-port (the head's address and rendezvous port), and
// --headless on every worker; GLOO_SOCKET_IFNAME names the interface of the
// host's peer address and VLLM_HOST_IP is that address; no NCCL_* variable
// is set. The head (rank 0) serves the API and parks as usual (vLLM's
// sleep is collective over the ranks); a worker serves no HTTP: it is
// ready once its process runs, and its park, wake, abort and load call
// nothing (the core measures its memory).
package vllm

import (
	"context"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginefacts"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// Family is this driver's engine family.
const Family = "vllm"

// Module is the module a launch runs.
const Module = "vllm.entrypoints.openai.api_server"

// VerifiedVersions are the vLLM releases CapyCTL is verified with; others
// run as custom.
// (from the engine table, sdk/enginefacts).
var VerifiedVersions = enginefacts.VLLM.Verified

// Paths of the engine's API the driver uses, from the engine table.
var (
	sleepPath         = enginefacts.VLLM.Path("sleep")
	wakePath          = enginefacts.VLLM.Path("wake")
	isSleepingPath    = enginefacts.VLLM.Path("is_sleeping")
	resetPrefixPath   = enginefacts.VLLM.Path("reset_prefix_cache")
	collectiveRPCPath = enginefacts.VLLM.Path("collective_rpc")
)

// metricsPath is where the engine serves its metrics.
const metricsPath = "/metrics"

// canaryPrompt is the fixed prompt whose answer proves readiness and, after
// a wake, that the same model answers the same way.
const canaryPrompt = "Say ready."

// canaryTokens bounds the canary answer.
const canaryTokens = 8

// configKeys are the keys of engine_config.vllm.
var configKeys = []pyengine.Key{
	{Name: "block_size_tokens", Type: "int", Min: 1, Doc: "KV block size in tokens (--block-size)"},
	{Name: "max_num_batched_tokens", Type: "int", Min: 1, Doc: "tokens per scheduler step (--max-num-batched-tokens)"},
	{Name: "safetensors_load_strategy", Type: "string", Values: []string{"eager", "lazy"}, Doc: "weight loading (eager by default while parking)"},
	{Name: "tool_call_parser", Type: "string", Doc: "auto (by model family), none, or a vLLM tool-call parser"},
	{Name: "reasoning_parser", Type: "string", Doc: "auto (by model family), none, or a vLLM reasoning parser"},
}

// parserNames are vLLM's names of the parsers picked by model family.
var parserNames = pyengine.ParserNames{Qwen3Tool: "hermes", CoderTool: "qwen3_coder", Reasoning: "qwen3"}

// metricNames are vLLM's idle signal and figures, from the engine table.
var metricNames = enginekit.MetricNamesOf(enginefacts.VLLM.Metrics)

// Driver is the vLLM driver.
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
		ParkTiers: []string{enginekit.ResidencyDeep, enginekit.ResidencyHostBacked},
		// Every launch sleeps at either level (--enable-sleep-mode is on
		// for both): the core picks the level at each park (park.go).
		TierPerPark:     true,
		APIs:            []string{"chat", "embeddings", "rerank"},
		AbortMode:       sdk.AbortModeCloseConnection,
		IdleSignal:      true,
		LMCache:         true,
		RequestIDHeader: "X-Request-Id",
		Groups:          true,
	}, pyengine.ConfigSchema(Family, configKeys)), nil
}

// Detect implements sdk.Driver: a venv with a vllm distribution, read from
// its *.dist-info without running Python.
func (d *Driver) Detect(_ context.Context, req *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	_, resp, err := pyengine.Detect(req.Path, pyengine.DetectSpec{Family: Family, Dist: "vllm", Verified: VerifiedVersions, Module: Module})
	if err != nil {
		return nil, err
	}
	resp.Notes = []string{"launches " + resp.Program + " -m " + Module}
	if !resp.Verified {
		resp.Notes = append(resp.Notes, "vLLM "+resp.Version+" is not a verified version (0.29 to 0.32): it runs as custom")
	}
	return resp, nil
}

// Flags implements sdk.Driver.
func (d *Driver) Flags(context.Context, *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	return Table.Response(), nil
}
