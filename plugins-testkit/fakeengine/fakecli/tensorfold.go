// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/formats"
)

// Environment variables of the TensorFold fake.
const (
	// tfMemoryLimitEnv is TensorFold's memory cap, in GiB (fractions
	// allowed).
	tfMemoryLimitEnv = "TENSORFOLD_CUDA_MEMORY_LIMIT_GB"
	// tfAPIKeyEnv turns on TensorFold's own authentication.
	tfAPIKeyEnv = "TENSORFOLD_API_KEY"
	// tfKernelBuildEnv is the fake's first-request kernel build time.
	tfKernelBuildEnv = "CAPYCTL_FAKE_KERNEL_BUILD"
	// tfKernelBuildFileEnv makes the build last until the file exists.
	tfKernelBuildFileEnv = "CAPYCTL_FAKE_KERNEL_BUILD_FILE"
)

// tensorFoldCommand runs the fake as `tensorfold serve <model dir> ...`.
// The knobs come from the environment (CAPYCTL_FAKE_*). Memory on the
// simulated GPU: the model's safetensors weights (or the sim-weights
// knob) and a KV cache that fills the TENSORFOLD_CUDA_MEMORY_LIMIT_GB cap
// (or the sim-kv knob); a cap too small for the weights and the knob's KV
// ends the engine with exit status 1.
func tensorFoldCommand(args []string, env func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "--version" {
		fmt.Fprintf(stdout, "tensorfold %s\n", fakeengine.TensorFoldVersion)
		return 0
	}
	if len(args) == 0 || args[0] != "serve" {
		fmt.Fprintln(stderr, "usage: tensorfold serve <model dir> --name NAME [options]")
		return 2
	}
	args = args[1:]
	if len(args) == 0 || len(args[0]) == 0 || args[0][0] == '-' {
		fmt.Fprintln(stderr, "tensorfold serve: the model directory comes first")
		return 2
	}
	modelDir := args[0]
	fs := flag.NewFlagSet("tensorfold serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		name       = fs.String("name", "", "served model name")
		host       = fs.String("host", "127.0.0.1", "listen address")
		port       = fs.Int("port", 8000, "listen port")
		parallel   = fs.Int("parallel", 8, "requests decoded together")
		contextLen = fs.Int("context", 0, "longest request in tokens")
		noDrafts   = fs.Bool("no-drafts", false, "turn speculative drafts off")
		apiKey     = fs.String("api-key", "", "require this key")
		backend    = fs.String("backend", "cuda", "cuda or cpu")
		_          = fs.Bool("no-update-check", false, "never check for updates")
		_          = fs.String("snapshot-dir", "", "where kernel snapshots go (none: nowhere)")
		_          = fs.String("drafter", "", "draft model (none: no drafts)")
		_          = fs.String("kv-dtype", "", "KV cache element type")
		_          = fs.String("name-priority", "", "ID=background")
		_          = fs.Int("max-tokens", 0, "the longest answer")
		_          = fs.Bool("thinking", false, "reasoning on")
		_          = fs.Bool("no-thinking", false, "reasoning off")
		tp         = fs.Int("tp", 1, "tensor parallel ranks, one per machine (1 or 2)")
		rank       = fs.Int("rank", 0, "this machine's rank in a --tp 2 pair (0: the head)")
		master     = fs.String("master", "", "the head's address, for --tp 2")
		masterPort = fs.Int("master-port", -1, "the head's rendezvous port, for --tp 2 (0 on the head: any free port, logged)")
	)
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tensorfold serve: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *name == "" {
		fmt.Fprintln(stderr, "tensorfold serve: --name is required")
		return 2
	}
	if *backend != "cuda" && *backend != "cpu" {
		fmt.Fprintf(stderr, "tensorfold serve: unknown backend %q\n", *backend)
		return 2
	}
	group, err := tensorFoldGroup(*tp, *rank, *master, *masterPort)
	if err != nil {
		fmt.Fprintf(stderr, "tensorfold serve: %v\n", err)
		return 2
	}
	cfg := fakeengine.Config{Stdout: stdout, Stderr: stderr, ServedName: *name, MaxRunning: *parallel}
	kfs := flag.NewFlagSet("tensorfold knobs", flag.ContinueOnError)
	knobs := fakeengine.RegisterKnobs(kfs, &cfg)
	if err := knobs.Resolve(env); err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 2
	}
	cfg.MaxRunning = *parallel
	cfg.APIKey = env(tfAPIKeyEnv)
	if *apiKey != "" {
		cfg.APIKey = *apiKey
	}
	opts := fakeengine.TensorFoldOptions{Context: *contextLen, Parallel: *parallel, NoDrafts: *noDrafts}
	if v := env(tfKernelBuildEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(stderr, "capyctl-fake-engine: %s: %v\n", tfKernelBuildEnv, err)
			return 2
		}
		opts.KernelBuild = d
	}
	opts.KernelBuildFile = env(tfKernelBuildFileEnv)
	if cfg.Sim.Weights == 0 {
		if m, err := formats.ReadSafetensorsDir(modelDir); err == nil {
			cfg.Sim.Weights = share(int64(m.WeightsBytes()), group.size)
		}
	}
	if v := env(tfMemoryLimitEnv); v != "" {
		gb, err := strconv.ParseFloat(v, 64)
		if err != nil || gb <= 0 {
			fmt.Fprintf(stderr, "tensorfold: %s=%q is not a positive number\n", tfMemoryLimitEnv, v)
			return 1
		}
		opts.MemoryCap = int64(gb * (1 << 30))
		need := cfg.Sim.Weights + cfg.Sim.KV + cfg.Sim.StartupPeak
		if need > opts.MemoryCap {
			fmt.Fprintf(stderr, "tensorfold: the memory cap (%s) cannot hold the weights and KV cache (%s)\n",
				fakeengine.FormatBytes(opts.MemoryCap), fakeengine.FormatBytes(need))
			return 1
		}
		if cfg.Sim.KV == 0 {
			// TensorFold sizes its KV cache to whatever its cap leaves.
			cfg.Sim.KV = opts.MemoryCap - cfg.Sim.Weights - cfg.Sim.StartupPeak
		}
	}
	cfg.Flavour = fakeengine.NewTensorFold(opts)
	if group.size > 1 {
		logf := func(level fakeengine.Level, format string, a ...any) {
			w := stdout
			if level != fakeengine.LevelInfo {
				w = stderr
			}
			fmt.Fprintln(w, cfg.Flavour.FormatLog(time.Now(), level, fmt.Sprintf(format, a...)))
		}
		g, err := group.config(env)
		if err != nil {
			logf(fakeengine.LevelError, "%v", err)
			return 1
		}
		if group.rank > 0 {
			return runGroupWorker(g, cfg.Sim, logf, "", nil, stderr)
		}
		cfg.Group = g
	}
	return serveEngine(cfg, *host, *port, knobs.ListenAll, stderr)
}

// tensorFoldGroup reads TensorFold's two-machine options: --tp 2, --rank,
// --master and --master-port (shared/reference/original.md, ADR 0028: "TensorFold
// --tp 2 --rank r --master --master-port"). TensorFold runs tensor
// parallel on exactly two machines; any other --tp is refused. That
// --master-port has no default, and that 0 on the head picks a free port,
// are the fake's assumptions, not TensorFold's documented behaviour.
func tensorFoldGroup(tp, rank int, master string, masterPort int) (groupLaunch, error) {
	g := groupLaunch{engine: "tensorfold", size: 1}
	switch {
	case tp == 1:
		if rank != 0 || master != "" || masterPort != -1 {
			return g, fmt.Errorf("--rank, --master and --master-port need --tp 2")
		}
		return g, nil
	case tp != 2:
		return g, fmt.Errorf("--tp %d: tensor parallel runs on exactly two machines (--tp 2)", tp)
	case rank != 0 && rank != 1:
		return g, fmt.Errorf("--rank %d: a --tp 2 pair has ranks 0 and 1", rank)
	case master == "" || masterPort < 0 || masterPort > 65535 || masterPort == 0 && rank != 0:
		return g, fmt.Errorf("--tp 2 needs --master ADDRESS and --master-port PORT")
	}
	g.size, g.rank = 2, rank
	g.addr = hostPort(master, masterPort)
	g.lostLog = "tensor parallel peer (rank %d) is gone: its connection closed"
	return g, nil
}
