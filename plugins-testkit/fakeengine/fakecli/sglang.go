// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/formats"
)

// Modules of the fake SGLang: the server, and its scheduler child.
const (
	sglangModule          = "sglang.launch_server"
	sglangSchedulerModule = "sglang.srt.managers.scheduler"
)

// sglangShmDir is where the fake SGLang makes its shared-memory segment.
const sglangShmDir = "/dev/shm"

// sglangInvocation is `python -m sglang.launch_server ...` (and the
// scheduler process it starts, `python -m sglang.srt.managers.scheduler`).
var sglangInvocation = invocation{
	usage: "python -m " + sglangModule + " --model-path DIR [SGLang options]",
	match: func(prog, module string, args []string) bool {
		return module == sglangModule || module == sglangSchedulerModule
	},
	run: func(args []string, env func(string) string, stdout, stderr io.Writer) int {
		if pythonModule(args) == sglangSchedulerModule {
			return sglangScheduler(env, stdout, stderr)
		}
		return sglangCommand(afterModule(args), env, stdout, stderr)
	},
}

// sglangOptions are the options the fake SGLang accepts, with their arity.
var sglangOptions = map[string]int{
	"model-path": argValue, "model": argValue, "served-model-name": argValue, "host": argValue, "port": argValue,
	"api-key": argValue, "admin-api-key": argValue, "config": argValue, "max-running-requests": argValue,
	"mem-fraction-static": argValue, "max-total-tokens": argValue, "tokenizer-worker-num": argValue,
	"context-length": argValue, "tool-call-parser": argValue, "reasoning-parser": argValue, "dtype": argValue,
	"kv-cache-dtype": argValue, "quantization": argValue, "chunked-prefill-size": argValue,
	"speculative-algorithm": argValue, "speculative-draft-model-path": argValue, "tp-size": argValue, "tp": argValue,
	"log-level": argValue, "random-seed": argValue, "watermark-config": argValue, "tokenizer-path": argValue,
	"enable-memory-saver": argFlag, "enable-lmcache": argFlag, "enable-weights-cpu-backup": argFlag, "enable-metrics": argFlag,
	"trust-remote-code": argFlag, "disable-cuda-graph": argFlag, "log-requests": argFlag, "enable-cache-report": argFlag,
	"enable-mixed-chunk": argFlag, "skip-server-warmup": argFlag,
	"tensor-parallel-size": argValue, "pp-size": argValue, "pipeline-parallel-size": argValue,
	"nnodes": argValue, "node-rank": argValue, "dist-init-addr": argValue, "enable-dp-attention": argFlag,
}

// sglangCommand runs the fake SGLang from SGLang's own options: --config
// FILE (YAML "key: value" lines, under the command line's options),
// --api-key, --enable-metrics, --enable-memory-saver,
// --enable-weights-cpu-backup and SGLANG_PLUGINS (the installed plugins of
// group sglang.srt.plugins that load: all when unset). It starts a
// scheduler child process ("sglang::scheduler") and makes a shared-memory
// segment, /dev/shm/sglang_loads_<pid>.shm, that it removes on a clean
// exit after it served. With CAPYCTL_FAKE_SCHEDULER_EXIT_DURING_STARTUP set
// the scheduler dies while the model loads and the server hangs, loading
// forever and logging errors, leaving the segment behind: what SGLang does.
// The simulated GPU holds the weights (*.safetensors in --model-path, or
// the sim-weights knob) and the KV cache (--max-total-tokens × the model's
// KV bytes per token, else --mem-fraction-static of the card less the
// weights, else the sim-kv knob).
func sglangCommand(args []string, env func(string) string, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "launch_server.py: error: "+format+"\n", a...)
		return 2
	}
	pa, err := parsePyArgs(args, sglangOptions, false)
	if err != nil {
		return fail("%v", err)
	}
	if file := pa.str("config", ""); file != "" {
		fromFile, err := sglangConfigArgs(file)
		if err != nil {
			return fail("%v", err)
		}
		// The command line wins over the file.
		if pa, err = parsePyArgs(append(fromFile, args...), sglangOptions, false); err != nil {
			return fail("%v", err)
		}
	}
	model := pa.str("model-path", pa.str("model", ""))
	if model == "" {
		return fail("the following arguments are required: --model-path")
	}
	cfg := fakeengine.Config{ServedName: pa.str("served-model-name", model), Stdout: stdout, Stderr: stderr}
	cfg.APIKey = pa.str("api-key", "")
	knobs, given, err := envKnobs(&cfg, env)
	if err != nil {
		return fail("%v", err)
	}
	if !given["max-running"] {
		if n, err := pa.num("max-running-requests", 0); err != nil {
			return fail("%v", err)
		} else if n > 0 {
			cfg.MaxRunning = int(n)
		}
	}
	hf, _ := formats.ReadHFConfig(model)
	group, tp, err := sglangGroup(pa)
	if err != nil {
		return fail("%v", err)
	}
	if cfg.Sim.StatePath != "" {
		if !given["sim-weights"] {
			cfg.Sim.Weights = share(weightsInDir(model), group.size)
		}
		if !given["sim-kv"] {
			tokens, err := pa.num("max-total-tokens", 0)
			if err != nil {
				return fail("%v", err)
			}
			// Each tensor-parallel rank keeps its heads' part of every token.
			kv := tokens * float64(hf.KVBytesPerToken(tp, pa.str("kv-cache-dtype", "")))
			if kv <= 0 {
				frac, err := pa.num("mem-fraction-static", 0)
				if err != nil {
					return fail("%v", err)
				}
				kv = max(0, frac*float64(simDeviceTotal(cfg.Sim))-float64(cfg.Sim.Weights))
			}
			cfg.Sim.KV = int64(kv)
		}
		if !given["sim-park-residue"] {
			cfg.Sim.ParkResidue = defaultParkResidue
		}
	}
	ctxLen, err := pa.num("context-length", 0)
	if err != nil {
		return fail("%v", err)
	}
	if ctxLen <= 0 {
		ctxLen = 4096
		if hf != nil && hf.MaxPositionEmbeddings > 0 {
			ctxLen = float64(hf.MaxPositionEmbeddings)
		}
	}
	workers, err := pa.num("tokenizer-worker-num", 1)
	if err != nil {
		return fail("%v", err)
	}
	installed := venvEntryPoints(os.Args[0], "sglang.srt.plugins")
	var plugins []string
	selection := env("SGLANG_PLUGINS")
	for _, p := range installed {
		if selection == "" || containsWord(strings.Split(selection, ","), p) {
			plugins = append(plugins, p)
		}
	}
	version := venvDistVersion(os.Args[0], "sglang")
	flavour := fakeengine.NewSGLang(fakeengine.SGLangOptions{
		Version: version, ModelPath: model, ContextLength: int(ctxLen), Metrics: pa.flags["enable-metrics"],
		MemorySaver: pa.flags["enable-memory-saver"], WeightsCPUBackup: pa.flags["enable-weights-cpu-backup"],
		TokenizerWorkers: int(workers), Plugins: plugins,
	})
	cfg.Flavour = flavour
	logf := func(level fakeengine.Level, format string, a ...any) {
		w := stdout
		if level != fakeengine.LevelInfo {
			w = stderr
		}
		fmt.Fprintln(w, flavour.FormatLog(time.Now(), level, fmt.Sprintf(format, a...)))
	}
	logf(fakeengine.LevelInfo, "SGLang %s: server_args model_path=%s served_model_name=%s", orString(version, fakeengine.DefaultSGLangVersion), model, cfg.ServedName)
	switch {
	case selection != "" && len(plugins) == 0:
		logf(fakeengine.LevelInfo, "SGLANG_PLUGINS=%s selects no installed plugin: loading none", selection)
	case len(plugins) > 0:
		logf(fakeengine.LevelInfo, "loading plugins: %s", strings.Join(plugins, ", "))
	}

	if group.size > 1 {
		g, err := group.config(env)
		if err != nil {
			logf(fakeengine.LevelError, "%v", err)
			return 1
		}
		if group.rank == 0 && pa.flags["enable-dp-attention"] {
			// With DP attention the head's ZeroMQ sockets listen on TCP
			// next to the rendezvous port.
			held, err := sglangDPAttentionPorts(group.addr, env)
			if err != nil {
				g.Listener.Close()
				logf(fakeengine.LevelError, "%v", err)
				return 1
			}
			defer func() {
				for _, ln := range held {
					ln.Close()
				}
			}()
		}
		if group.rank > 0 {
			// A non-zero node rank runs its schedulers and, once they are
			// ready, only a health check server on --host and --port.
			port, err := pa.num("port", 30000)
			if err != nil || port < 0 || port > 65535 {
				return fail("argument --port: invalid value")
			}
			return runGroupWorker(g, cfg.Sim, logf, hostPort(pa.str("host", "127.0.0.1"), int(port)), sglangWorkerHealth(), stderr)
		}
		cfg.Group = g
	}
	schedulerDies := env(fakeengine.EnvName("scheduler-exit-during-startup")) != ""
	if schedulerDies {
		// The server waits for a scheduler that will never report.
		cfg.HoldStartupFile = filepath.Join(os.TempDir(), fmt.Sprintf("capyctl-fake-sglang-never-%d", os.Getpid()))
	}
	port, err := pa.num("port", 30000)
	if err != nil || port < 0 || port > 65535 {
		return fail("argument --port: invalid value")
	}
	if pa.flags["enable-lmcache"] {
		// SGLang's LMCache integration, configured from LMCACHE_*.
		kv, err := connectLMCache(env)
		if err != nil {
			logf(fakeengine.LevelError, "LMCache: %v", err)
			return 1
		}
		defer kv.Close()
		cfg.KVConnector = kv
		cfg.ReportCachedTokens = pa.flags["enable-cache-report"]
	}
	return serveSGLang(cfg, pa.str("host", "127.0.0.1"), int(port), knobs.ListenAll, schedulerDies, logf, stderr)
}

// serveSGLang serves like serveEngine, with SGLang's scheduler child and
// shared-memory segment around it.
func serveSGLang(cfg fakeengine.Config, host string, port int, listenAll, schedulerDies bool, logf func(fakeengine.Level, string, ...any), stderr io.Writer) int {
	e, err := fakeengine.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 2
	}
	network := "tcp"
	if listenAll {
		network, host = "tcp4", "0.0.0.0"
	}
	ln, err := fakeengine.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 1
	}
	var shm *os.File
	shmPath := filepath.Join(sglangShmDir, fmt.Sprintf("sglang_loads_%d.shm", os.Getpid()))
	if fi, err := os.Stat(sglangShmDir); err == nil && fi.IsDir() {
		if f, err := os.OpenFile(shmPath, os.O_CREATE|os.O_RDWR, 0o600); err == nil {
			_ = f.Truncate(4096)
			shm = f
		}
	}
	var schedulerGone atomic.Bool
	sched, err := startScheduler(cfg.Stdout, cfg.Stderr)
	if err != nil {
		logf(fakeengine.LevelError, "start scheduler: %v", err)
	} else {
		go func() {
			_ = sched.Wait()
			schedulerGone.Store(true)
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if schedulerDies {
		// What follows a dead scheduler: the server keeps waiting and its
		// metrics collector fails over and over.
		go func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if schedulerGone.Load() {
					logf(fakeengine.LevelError, "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/sglang_prometheus_%d/gauge_all.db'", os.Getpid())
				}
			}
		}()
	}
	err = e.Serve(ctx, ln)
	served := false
	select {
	case <-e.Ready():
		served = true
	default:
	}
	if sched != nil && sched.Process != nil && !schedulerGone.Load() {
		_ = sched.Process.Signal(syscall.SIGTERM)
	}
	if shm != nil {
		shm.Close()
		if served {
			os.Remove(shmPath)
		}
	}
	var x *fakeengine.ExitError
	switch {
	case errors.As(err, &x):
		return x.Code
	case err != nil:
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 1
	}
	return e.Flavour().SignalExitCode()
}

// startScheduler starts the scheduler child: this executable again, as
// `<interpreter> -m sglang.srt.managers.scheduler`, in the same process
// group, ended with the server.
func startScheduler(stdout, stderr io.Writer) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{
		Path:        exe,
		Args:        []string{os.Args[0], "-m", sglangSchedulerModule},
		Env:         os.Environ(),
		Stdout:      stdout,
		Stderr:      stderr,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM},
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// sglangScheduler is the scheduler child: named sglang::scheduler, it waits
// for a signal or its parent's end, or dies at once when
// CAPYCTL_FAKE_SCHEDULER_EXIT_DURING_STARTUP says so.
func sglangScheduler(env func(string) string, stdout, stderr io.Writer) int {
	_ = os.WriteFile("/proc/self/comm", []byte("sglang::scheduler"), 0)
	parent := os.Getppid()
	ts := time.Now().Format("2006-01-02 15:04:05")
	if s := env(fakeengine.EnvName("scheduler-exit-during-startup")); s != "" {
		code, err := strconv.Atoi(s)
		if err != nil {
			code = 1
		}
		fmt.Fprintf(stderr, "[%s TP0] Scheduler hit an exception: Traceback (most recent call last):\n", ts)
		fmt.Fprintf(stderr, "[%s TP0]   File \"sglang/srt/managers/scheduler.py\", line 1, in run_scheduler_process\n", ts)
		fmt.Fprintf(stderr, "[%s TP0] RuntimeError: simulated scheduler failure while loading the model\n", ts)
		return code
	}
	fmt.Fprintf(stdout, "[%s TP0] scheduler process %d started\n", ts, os.Getpid())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-sigs:
			return 0
		case <-t.C:
			if os.Getppid() != parent {
				return 0
			}
		}
	}
}

// sglangConfigArgs turns a --config YAML file of "key: value" lines into
// options ("true" makes a flag; "false" leaves it out).
func sglangConfigArgs(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("argument --config: %v", err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("argument --config: %s: not a key: value line: %q", path, line)
		}
		k = strings.ReplaceAll(strings.TrimSpace(k), "_", "-")
		v = strings.TrimSpace(v)
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		} else {
			v = strings.Trim(v, "'")
		}
		arity, known := sglangOptions[k]
		switch {
		case known && arity == argFlag:
			if v == "true" || v == "True" {
				out = append(out, "--"+k)
			}
		default:
			out = append(out, "--"+k, v)
		}
	}
	return out, nil
}

// sglangGroup reads SGLang's multi-node options (docs.sglang.io "Multi-Node
// Deployment": --tp, --dist-init-addr host:port of the head, --nnodes,
// --node-rank) and returns the launch and the tensor-parallel size. A
// size of 1 is no group.
func sglangGroup(pa *pyArgs) (groupLaunch, int, error) {
	g := groupLaunch{engine: "sglang", size: 1}
	num := func(def float64, names ...string) (int, error) {
		for _, n := range names {
			if pa.str(n, "") != "" {
				v, err := pa.num(n, def)
				if err != nil || v < 0 {
					return 0, fmt.Errorf("argument --%s: invalid value: '%s'", n, pa.str(n, ""))
				}
				return int(v), nil
			}
		}
		return int(def), nil
	}
	tp, err := num(1, "tp-size", "tp", "tensor-parallel-size")
	if err != nil {
		return g, 0, err
	}
	pp, err := num(1, "pp-size", "pipeline-parallel-size")
	if err != nil {
		return g, 0, err
	}
	if g.size, err = num(1, "nnodes"); err != nil {
		return g, 0, err
	}
	if g.rank, err = num(0, "node-rank"); err != nil {
		return g, 0, err
	}
	if g.size <= 1 {
		// One machine: the fake is one process on one card, whatever --tp.
		g.size = 1
		return g, 1, nil
	}
	addr := pa.str("dist-init-addr", "")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		// SGLang's own assertion in PortArgs.init_new.
		return g, 0, errors.New("please provide --dist-init-addr as host:port of head node")
	}
	if g.rank >= g.size {
		return g, 0, fmt.Errorf("--node-rank %d must be less than --nnodes %d", g.rank, g.size)
	}
	if err := parallelFits(tp, pp, g.size); err != nil {
		return g, 0, err
	}
	g.addr = addr
	g.lostLog = "Scheduler hit an exception: group rank %d is gone (its connection closed)"
	return g, tp, nil
}

// portWaitEnv bounds how long the fake SGLang waits for a busy port (a Go
// duration; SGLang's wait_port_available waits 30 s).
const portWaitEnv = "CAPYCTL_FAKE_PORT_WAIT"

// sglangDPAttentionPorts binds the ports an SGLang head with DP attention
// takes after its --dist-init-addr port (fakeengine.FactSGLangDPAttentionPorts:
// PortArgs.init_new's port_base = dist_init_port + 1 and the five after
// it), waiting for a busy one as wait_port_available does, and fails in
// its words when one stays busy. The listeners are held until the engine
// exits.
func sglangDPAttentionPorts(distInitAddr string, env func(string) string) ([]net.Listener, error) {
	host, ps, err := net.SplitHostPort(distInitAddr)
	if err != nil {
		return nil, err
	}
	dist, err := strconv.Atoi(ps)
	if err != nil {
		return nil, err
	}
	wait := 30 * time.Second
	if s := env(portWaitEnv); s != "" {
		if wait, err = time.ParseDuration(s); err != nil || wait <= 0 {
			return nil, fmt.Errorf("%s=%q: want a positive duration", portWaitEnv, s)
		}
	}
	n, _ := strconv.Atoi(fakeengine.FactSGLangDPAttentionPorts.Value)
	names := []string{"port_base", "detokenizer_port", "rpc_port", "metrics_port", "scheduler_input_port", "load_collector_port"}
	var held []net.Listener
	for i := range n {
		port := dist + 1 + i
		deadline := time.Now().Add(wait)
		for {
			ln, err := net.Listen("tcp", hostPort(host, port))
			if err == nil {
				held = append(held, ln)
				break
			}
			if time.Now().After(deadline) {
				for _, l := range held {
					l.Close()
				}
				return nil, fmt.Errorf("ValueError: %s at %d is not available in %d seconds. Port is already in use.", names[i], port, int(wait.Seconds()))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return held, nil
}

// sglangWorkerHealth is what SGLang's non-zero node ranks serve:
// launch_dummy_health_check_server in python/sglang/srt/utils (GET /health,
// GET /health_generate and, in newer releases, GET /ping, each an empty
// 200); every other path is FastAPI's 404.
func sglangWorkerHealth() http.Handler {
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }
	for _, p := range []string{"GET /health", "GET /health_generate", "GET /ping"} {
		mux.HandleFunc(p, ok)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fakeengine.WriteJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	return mux
}

func containsWord(list []string, s string) bool {
	for _, x := range list {
		if strings.TrimSpace(x) == s {
			return true
		}
	}
	return false
}
