// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/formats"
)

// llamaVersionEnv overrides the version `llama-server --version` prints.
const llamaVersionEnv = "CAPYCTL_FAKE_VERSION"

// llamaOpt is one llama-server option: its spellings and whether it takes
// a value.
type llamaOpt struct {
	names []string
	value bool
}

// llamaOpts are the options the fake understands, by canonical name;
// anything else is refused as llama-server refuses it.
var llamaOpts = map[string]llamaOpt{
	"model":            {[]string{"-m", "--model"}, true},
	"host":             {[]string{"--host"}, true},
	"port":             {[]string{"--port"}, true},
	"alias":            {[]string{"-a", "--alias"}, true},
	"ctx-size":         {[]string{"-c", "--ctx-size"}, true},
	"parallel":         {[]string{"-np", "--parallel"}, true},
	"gpu-layers":       {[]string{"-ngl", "--gpu-layers", "--n-gpu-layers"}, true},
	"cache-type-k":     {[]string{"-ctk", "--cache-type-k"}, true},
	"cache-type-v":     {[]string{"-ctv", "--cache-type-v"}, true},
	"batch-size":       {[]string{"-b", "--batch-size"}, true},
	"ubatch-size":      {[]string{"-ub", "--ubatch-size"}, true},
	"threads":          {[]string{"-t", "--threads"}, true},
	"threads-http":     {[]string{"--threads-http"}, true},
	"timeout":          {[]string{"-to", "--timeout"}, true},
	"fit":              {[]string{"--fit"}, true},
	"cache-ram":        {[]string{"--cache-ram"}, true},
	"seed":             {[]string{"-s", "--seed"}, true},
	"flash-attn":       {[]string{"-fa", "--flash-attn"}, true},
	"api-key":          {[]string{"--api-key"}, true},
	"metrics":          {[]string{"--metrics"}, false},
	"slots":            {[]string{"--slots"}, false},
	"no-slots":         {[]string{"--no-slots"}, false},
	"props":            {[]string{"--props"}, false},
	"embeddings":       {[]string{"--embedding", "--embeddings"}, false},
	"reranking":        {[]string{"--rerank", "--reranking"}, false},
	"kv-unified":       {[]string{"-kvu", "--kv-unified"}, false},
	"no-kv-unified":    {[]string{"--no-kv-unified"}, false},
	"no-context-shift": {[]string{"--no-context-shift"}, false},
	"context-shift":    {[]string{"--context-shift"}, false},
	"offline":          {[]string{"--offline"}, false},
	"no-webui":         {[]string{"--no-webui"}, false},
	"jinja":            {[]string{"--jinja"}, false},
	"no-jinja":         {[]string{"--no-jinja"}, false},
	"no-mmap":          {[]string{"--no-mmap"}, false},
	"cont-batching":    {[]string{"-cb", "--cont-batching"}, false},
	"log-timestamps":   {[]string{"--log-timestamps"}, false},
	"log-prefix":       {[]string{"--log-prefix"}, false},
	"version":          {[]string{"--version"}, false},
	"help":             {[]string{"-h", "--help", "--usage"}, false},
}

// parseLlamaArgs reads llama-server's argv ("-c 512", "--ctx-size=512").
func parseLlamaArgs(args []string) (map[string]string, error) {
	byName := map[string]string{}
	for canon, o := range llamaOpts {
		for _, n := range o.names {
			byName[n] = canon
		}
	}
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		tok, val, hasVal := strings.Cut(args[i], "=")
		canon, ok := byName[tok]
		if !ok {
			return nil, fmt.Errorf("invalid argument: %s", args[i])
		}
		if !llamaOpts[canon].value {
			if hasVal {
				return nil, fmt.Errorf("invalid argument: %s", args[i])
			}
			out[canon] = "true"
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("error while handling argument \"%s\": expected value for argument", tok)
			}
			i++
			val = args[i]
		}
		out[canon] = val
	}
	return out, nil
}

// llamaServerCommand runs the fake as llama-server, from the real argv.
// The knobs come from the environment only (CAPYCTL_FAKE_*); the API key
// from LLAMA_API_KEY or --api-key. Without --model, or with a model that
// is not a readable GGUF file, it fails as llama-server does: log lines and
// exit status 134, having never answered HTTP.
func llamaServerCommand(args []string, env func(string) string, stdout, stderr io.Writer) int {
	a, err := parseLlamaArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 1
	}
	if a["help"] != "" {
		printLlamaHelp(stdout)
		return 0
	}
	if a["version"] != "" {
		v := env(llamaVersionEnv)
		if v == "" {
			v = "0.7.0"
		}
		fmt.Fprintf(stderr, "version: %s (c392e5094)\nbuilt with cc (GCC) 12.2.0 for x86_64-linux-gnu\n", v)
		return 0
	}
	// llama-server ends within about a second of SIGTERM, requests in
	// flight or not.
	cfg := fakeengine.Config{Stdout: stdout, Stderr: stderr, ShutdownGrace: time.Second}
	fs := flag.NewFlagSet("llama-server knobs", flag.ContinueOnError)
	knobs := fakeengine.RegisterKnobs(fs, &cfg)
	if err := knobs.Resolve(env); err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 2
	}
	cfg.APIKey = env("LLAMA_API_KEY")
	if k := a["api-key"]; k != "" {
		cfg.APIKey = k
	}
	num := func(name string, def int) (int, error) {
		s, ok := a[name]
		if !ok {
			return def, nil
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("error while handling argument \"--%s\": %q is not a number", name, s)
		}
		return n, nil
	}
	port, err1 := num("port", 8080)
	ctx, err2 := num("ctx-size", 4096)
	np, err3 := num("parallel", 1)
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	host := a["host"]
	if host == "" {
		host = "127.0.0.1"
	}
	fmt.Fprintf(stderr, "main: HTTP server is listening, hostname: %s, port: %d, http threads: %d\nmain: loading model\n", host, port, np+2)
	model := a["model"]
	if model == "" {
		fmt.Fprintln(stderr, "llama_model_load: error loading model: no model given (--model)\nmain: exiting due to model loading error")
		return 134
	}
	g, err := formats.ReadGGUFFile(model)
	if err != nil {
		fmt.Fprintf(stderr, "llama_model_load: error loading model: %v\nllama_load_model_from_file: failed to load model\nmain: exiting due to model loading error\n", err)
		return 134
	}
	if ctx == 0 {
		ctx = int(g.ContextLength())
	}
	if np == 0 {
		np = 1
	}
	cfg.MaxRunning = np
	vocab := 0
	if v, ok := g.Metadata["tokenizer.ggml.tokens"].Value.(formats.GGUFArrayValue); ok {
		vocab = v.Len()
	}
	tmpl, _ := g.String("tokenizer.chat_template")
	opts := fakeengine.LlamaCppOptions{
		ModelPath: model, Alias: a["alias"], CtxSize: ctx, Parallel: np,
		Metrics: a["metrics"] != "", Slots: a["slots"] != "" && a["no-slots"] == "", Props: a["props"] != "",
		Embeddings: a["embeddings"] != "", Reranking: a["reranking"] != "",
		NoContextShift: a["no-context-shift"] != "", ChatTemplate: tmpl, TokenRate: cfg.TokenRate,
		Meta: fakeengine.LlamaCppMeta{VocabType: 1, NVocab: vocab, NCtxTrain: int(g.ContextLength()), NEmbd: int(g.EmbeddingLength()),
			NParams: g.Parameters(), Size: g.WeightsBytes()},
	}
	cfg.ServedName = opts.Alias
	if cfg.ServedName == "" {
		cfg.ServedName = model
	}
	// Memory on the simulated GPU follows the model unless a knob says
	// otherwise: the weights, and the KV cache of every slot's context,
	// of the layers offloaded (-ngl: the last n layers; more than the
	// layers, or "all", offloads every tensor).
	if ngl := a["gpu-layers"]; ngl != "0" && cfg.Sim.Weights == 0 && cfg.Sim.KV == 0 {
		cfg.Sim.Weights = int64(g.WeightsBytes())
		cfg.Sim.KV = int64(ctx) * llamaKVPerToken(g, a["cache-type-k"], a["cache-type-v"])
		layers := int64(g.BlockCount())
		if n, err := strconv.ParseInt(ngl, 10, 64); err == nil && n >= 0 && n < layers {
			cfg.Sim.Weights = offloadedBytes(g, layers-n)
			cfg.Sim.KV = cfg.Sim.KV * n / layers
		}
	}
	cfg.Flavour = fakeengine.NewLlamaCpp(opts)
	// A --host ending in .sock binds a Unix socket (server-http.cpp).
	sock := ""
	if strings.HasSuffix(host, ".sock") {
		sock = host
	}
	return serveEngineOn(cfg, host, port, sock, knobs.ListenAll, stderr)
}

// offloadedBytes is the bytes of the tensors of layers from..end
// ("blk.<n>.").
func offloadedBytes(g *formats.GGUFFile, from int64) int64 {
	var b int64
	for _, t := range g.Tensors {
		rest, ok := strings.CutPrefix(t.Name, "blk.")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ".")
		if n, err := strconv.ParseInt(num, 10, 64); err == nil && n >= from {
			b += int64(t.Bytes)
		}
	}
	return b
}

// llamaKVPerToken is the KV bytes per token with the K and V cache types
// (f16 when not given): half of each type's K+V figure.
func llamaKVPerToken(g *formats.GGUFFile, ctk, ctv string) int64 {
	kind := func(name string) formats.GGMLType {
		if t, ok := formats.GGMLTypeByName(name); ok {
			return t
		}
		return 1 // F16
	}
	k, _ := g.KVBytesPerToken(kind(ctk))
	v, _ := g.KVBytesPerToken(kind(ctv))
	return int64(k/2 + v/2)
}

// printLlamaHelp prints the options the fake takes, one per line, as
// llama-server's --help lists them ("-c,    --ctx-size N").
func printLlamaHelp(w io.Writer) {
	names := make([]string, 0, len(llamaOpts))
	for canon := range llamaOpts {
		names = append(names, canon)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "----- common params -----")
	fmt.Fprintln(w)
	for _, canon := range names {
		o := llamaOpts[canon]
		arg := ""
		if o.value {
			arg = " " + strings.ToUpper(strings.ReplaceAll(canon, "-", "_"))
		}
		help := "(fake)"
		if canon == "host" {
			// llama.cpp's own words since ggml-org/llama.cpp#12613.
			help = "ip address to listen, or bind to an UNIX socket if the address ends with .sock (default: 127.0.0.1)"
		}
		fmt.Fprintf(w, "%-40s %s\n", strings.Join(o.names, ", ")+arg, help)
	}
}
