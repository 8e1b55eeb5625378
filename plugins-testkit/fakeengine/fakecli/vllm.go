// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/formats"
)

// vllmModule is the module of vLLM's OpenAI server.
const vllmModule = "vllm.entrypoints.openai.api_server"

// vllmInvocation is `python -m vllm.entrypoints.openai.api_server ...` and
// `vllm serve MODEL ...`.
var vllmInvocation = invocation{
	usage: "python -m " + vllmModule + " --model DIR [vLLM options]   (or: vllm serve DIR [vLLM options])",
	match: func(prog, module string, args []string) bool {
		return module == vllmModule || (prog == "vllm" && len(args) > 0 && args[0] == "serve")
	},
	run: func(args []string, env func(string) string, stdout, stderr io.Writer) int {
		if len(args) > 0 && args[0] == "serve" {
			rest := args[1:]
			if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
				rest = append([]string{"--model", rest[0]}, rest[1:]...)
			}
			return vllmCommand(rest, env, stdout, stderr)
		}
		return vllmCommand(afterModule(args), env, stdout, stderr)
	},
}

// vllmOptions are the options the fake vLLM accepts, with their arity.
// Others are refused as vLLM refuses unknown options.
var vllmOptions = func() map[string]int {
	m := map[string]int{
		"model": argValue, "served-model-name": argMany, "host": argValue, "port": argValue, "api-key": argValue,
		"max-num-seqs": argValue, "max-model-len": argValue, "gpu-memory-utilization": argValue,
		"kv-cache-memory-bytes": argValue, "safetensors-load-strategy": argValue, "dtype": argValue,
		"quantization": argValue, "kv-cache-dtype": argValue, "block-size": argValue,
		"max-num-batched-tokens": argValue, "tool-call-parser": argValue, "reasoning-parser": argValue,
		"seed": argValue, "tokenizer": argValue, "download-dir": argValue, "chat-template": argValue,
		"speculative-config": argValue, "kv-transfer-config": argValue, "compilation-config": argValue,
		"tensor-parallel-size": argValue, "uvicorn-log-level": argValue, "max-log-len": argValue,
		"generation-config": argValue, "swap-space": argValue, "cpu-offload-gb": argValue, "revision": argValue,
		"config": argValue, "root-path": argValue, "uds": argValue, "middleware": argValue, "logging-config": argValue,
		"trust-remote-code": argFlag, "enable-auto-tool-choice": argFlag, "enforce-eager": argFlag,
		"disable-log-requests": argFlag, "enable-request-id-headers": argFlag, "enable-server-load-tracking": argFlag,
		"disable-fastapi-docs": argFlag, "disable-uvicorn-access-log": argFlag, "disable-log-stats": argFlag,
		"headless": argFlag, "pipeline-parallel-size": argValue, "nnodes": argValue, "node-rank": argValue,
		"master-addr": argValue, "master-port": argValue, "distributed-executor-backend": argValue,
	}
	// Boolean options take --opt and --no-opt (BooleanOptionalAction).
	for _, b := range []string{"enable-sleep-mode", "enable-log-requests", "enable-log-outputs", "enable-prefix-caching",
		"enable-prompt-tokens-details", "enable-chunked-prefill"} {
		m[b], m["no-"+b] = argFlag, argFlag
	}
	return m
}()

// vllmCommand runs the fake vLLM from vLLM's own options and environment:
// VLLM_API_KEY (or --api-key) guards /v1, VLLM_SERVER_DEV_MODE (an
// integer, as vLLM parses it) enables the sleep routes, and without
// VLLM_NO_USAGE_STATS=1 or a do-not-track variable it says it would report
// usage. The simulated GPU holds the weights (the *.safetensors in --model,
// or the sim-weights knob) and the KV cache (--kv-cache-memory-bytes, else
// --gpu-memory-utilization of the card less the weights, else the sim-kv
// knob). Knobs come from CAPYCTL_FAKE_* variables.
func vllmCommand(args []string, env func(string) string, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "api_server.py: error: "+format+"\n", a...)
		return 2
	}
	pa, err := parsePyArgs(args, vllmOptions, true)
	if err != nil {
		return fail("%v", err)
	}
	model := pa.str("model", "")
	if model == "" {
		return fail("the following arguments are required: --model")
	}
	served := model
	if names := pa.values["served-model-name"]; len(names) > 0 {
		served = names[0]
	}
	devMode := false
	if s := env("VLLM_SERVER_DEV_MODE"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			fmt.Fprintf(stderr, "ValueError: invalid literal for int() with base 10: '%s' (VLLM_SERVER_DEV_MODE)\n", s)
			return 1
		}
		devMode = n != 0
	}
	cfg := fakeengine.Config{ServedName: served, Stdout: stdout, Stderr: stderr}
	cfg.APIKey = pa.str("api-key", env("VLLM_API_KEY"))
	knobs, given, err := envKnobs(&cfg, env)
	if err != nil {
		return fail("%v", err)
	}
	if !given["max-running"] {
		n, err := pa.num("max-num-seqs", fakeengine.DefaultMaxRunning)
		if err != nil || n < 1 {
			return fail("argument --max-num-seqs: invalid value")
		}
		cfg.MaxRunning = int(n)
	}
	group, err := vllmGroup(pa)
	if err != nil {
		return fail("%v", err)
	}
	if cfg.Sim.StatePath != "" {
		// vLLM asks the card for ceil(total × gpu_memory_utilization)
		// and refuses to start when less is free, whatever
		// --kv-cache-memory-bytes says (fakeengine.FactVLLMFreeMemory).
		defUtil, _ := strconv.ParseFloat(fakeengine.FactVLLMGPUMemoryUtilization.Value, 64)
		util, err := pa.num("gpu-memory-utilization", defUtil)
		if err != nil || util <= 0 || util > 1 {
			return fail("argument --gpu-memory-utilization: invalid value")
		}
		cfg.Sim.StartCheck = vllmFreeMemoryCheck(util)
		if !given["sim-weights"] {
			cfg.Sim.Weights = share(weightsInDir(model), group.size)
		}
		if !given["sim-kv"] {
			kv, err := pa.num("kv-cache-memory-bytes", 0)
			if err != nil {
				return fail("%v", err)
			}
			if kv <= 0 {
				util, err := pa.num("gpu-memory-utilization", 0)
				if err != nil {
					return fail("%v", err)
				}
				kv = max(0, util*float64(simDeviceTotal(cfg.Sim))-float64(cfg.Sim.Weights))
			}
			cfg.Sim.KV = int64(kv)
		}
		if !given["sim-park-residue"] {
			cfg.Sim.ParkResidue = defaultParkResidue
		}
	}
	maxLen, err := pa.num("max-model-len", 0)
	if err != nil {
		return fail("%v", err)
	}
	if maxLen <= 0 {
		maxLen = 4096
		if hf, err := formats.ReadHFConfig(model); err == nil && hf.MaxPositionEmbeddings > 0 {
			maxLen = float64(hf.MaxPositionEmbeddings)
		}
	}
	version := venvDistVersion(os.Args[0], "vllm")
	cfg.Flavour = fakeengine.NewVLLM(fakeengine.VLLMOptions{
		Version: version, DevMode: devMode, SleepMode: pa.flags["enable-sleep-mode"], MaxModelLen: int(maxLen), Root: model,
	})
	f := cfg.Flavour
	logf := func(level fakeengine.Level, format string, a ...any) {
		w := stdout
		if level != fakeengine.LevelInfo {
			w = stderr
		}
		fmt.Fprintln(w, f.FormatLog(time.Now(), level, fmt.Sprintf(format, a...)))
	}
	logf(fakeengine.LevelInfo, "vLLM API server version %s", orString(version, fakeengine.DefaultVLLMVersion))
	if env("VLLM_NO_USAGE_STATS") != "1" && env("VLLM_DO_NOT_TRACK") != "1" && env("DO_NOT_TRACK") != "1" {
		logf(fakeengine.LevelWarn, "Usage stats collection is enabled: reports would go to https://stats.vllm.ai (the fake sends nothing)")
	}
	if pa.flags["enable-log-requests"] || pa.flags["enable-log-outputs"] {
		logf(fakeengine.LevelWarn, "request logging is on: prompts and outputs would be logged")
	}
	if strings.Contains(pa.str("kv-transfer-config", ""), "LMCacheConnector") {
		// LMCache's connector, configured from LMCACHE_* variables.
		kv, err := connectLMCache(env)
		if err != nil {
			logf(fakeengine.LevelError, "LMCache connector: %v", err)
			return 1
		}
		defer kv.Close()
		cfg.KVConnector = kv
		cfg.ReportCachedTokens = pa.flags["enable-prompt-tokens-details"]
		logf(fakeengine.LevelInfo, "LMCache connector: remote %s", env("LMCACHE_REMOTE_URL"))
	}
	if group.size > 1 {
		g, err := group.config(env)
		if err != nil {
			logf(fakeengine.LevelError, "%v", err)
			return 1
		}
		if group.rank > 0 {
			// --headless: the engine's ranks without an API server.
			return runGroupWorker(g, cfg.Sim, logf, "", nil, stderr)
		}
		cfg.Group = g
	}
	port, err := pa.num("port", 8000)
	if err != nil || port < 0 || port > 65535 {
		return fail("argument --port: invalid value")
	}
	host := pa.str("host", "")
	if host == "" {
		host = "0.0.0.0" // vLLM binds every interface when no host is given
	}
	// --uds: "Unix domain socket path. If set, host and port arguments are
	// ignored." Releases before it refuse the option as argparse does.
	uds := pa.str("uds", "")
	if uds != "" && version != "" && !releaseAtLeast(version, fakeengine.VLLMUDSSince) {
		return fail("unrecognized arguments: --uds %s", uds)
	}
	return serveEngineOn(cfg, host, int(port), uds, knobs.ListenAll, stderr)
}

// vllmFreeMemoryCheck is vLLM's check of a card's free memory before it
// loads: request_memory in vllm/v1/worker/utils.py asks for
// ceil(total × util) and raises its ValueError when less is free.
func vllmFreeMemoryCheck(util float64) func(free, total int64, index int) error {
	return func(free, total int64, index int) error {
		requested := int64(math.Ceil(float64(total) * util))
		if free >= requested {
			return nil
		}
		gib := func(b int64) float64 { return math.Round(float64(b)/(1<<30)*100) / 100 }
		return fmt.Errorf(fakeengine.FactVLLMFreeMemory.Value, index, gib(free), gib(total), util, gib(requested))
	}
}

// vllmGroup reads vLLM's multi-node options for the multiprocessing
// backend ("Running vLLM with MultiProcessing" in vLLM's distributed
// serving docs; ParallelConfig.nnodes, node_rank, master_addr and
// master_port in vllm/config/parallel.py, defaults 1, 0, 127.0.0.1 and
// 29501). The head is node rank 0 without --headless; every other rank
// runs --headless. A size of 1 is no group.
func vllmGroup(pa *pyArgs) (groupLaunch, error) {
	g := groupLaunch{engine: "vllm", size: 1}
	nnodes, err := pa.num("nnodes", 1)
	if err != nil || nnodes < 1 {
		return g, fmt.Errorf("argument --nnodes: invalid value: '%s'", pa.str("nnodes", ""))
	}
	rank, err := pa.num("node-rank", 0)
	if err != nil || rank < 0 {
		return g, fmt.Errorf("argument --node-rank: invalid value: '%s'", pa.str("node-rank", ""))
	}
	g.size, g.rank = int(nnodes), int(rank)
	if g.size == 1 {
		return g, nil
	}
	if b := pa.str("distributed-executor-backend", "mp"); b != "mp" {
		return g, fmt.Errorf("capyctl-fake-engine simulates multi-node vLLM with the mp backend only, not %q", b)
	}
	if g.rank >= g.size {
		return g, fmt.Errorf("node_rank %d must be less than nnodes %d", g.rank, g.size)
	}
	tp, err1 := pa.num("tensor-parallel-size", 1)
	pp, err2 := pa.num("pipeline-parallel-size", 1)
	if err1 != nil || err2 != nil {
		return g, errors.New("argument --tensor-parallel-size or --pipeline-parallel-size: invalid value")
	}
	if err := parallelFits(int(tp), int(pp), g.size); err != nil {
		return g, err
	}
	// IMPORTANT: the fake's rule, not one read in vLLM: a rank other than
	// 0 must be headless and rank 0 must not be, as the docs launch them.
	switch headless := pa.flags["headless"]; {
	case g.rank > 0 && !headless:
		return g, fmt.Errorf("capyctl-fake-engine: node rank %d runs --headless (only rank 0 serves the API)", g.rank)
	case g.rank == 0 && headless:
		return g, errors.New("capyctl-fake-engine: node rank 0 is the head and serves the API; it does not run --headless")
	}
	port, err := pa.num("master-port", 29501)
	if err != nil || port < 0 || port > 65535 {
		return g, fmt.Errorf("argument --master-port: invalid value: '%s'", pa.str("master-port", ""))
	}
	g.addr = hostPort(pa.str("master-addr", "127.0.0.1"), int(port))
	g.lostLog = "EngineCore failed: group rank %d is gone (its connection closed); the engine is dead"
	// A vLLM rank does not notice a lost peer until its next collective,
	// which gives up after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
	// (fakeengine.FactVLLMPeerLoss).
	g.peerLoss = fakeengine.PeerLossHang
	g.timeoutEnv = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
	g.stuckLog = "TimeoutError: RPC call to execute_model timed out. EngineCore encountered a fatal error."
	return g, nil
}

func orString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
