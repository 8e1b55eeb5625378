// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// Environment variables read besides the knobs' own.
const (
	// EnvPrefix starts the variable of every knob: --startup-delay is
	// CAPYCTL_FAKE_STARTUP_DELAY.
	EnvPrefix = "CAPYCTL_FAKE_"
	// EnvSimState is the simulated GPU's state file when --sim-state is
	// not given (CapyCTL's dev mode sets it for every engine).
	EnvSimState = "CAPYCTL_SIMGPU_STATE"
	// EnvVisibleDevices picks the simulated device, as it picks a CUDA one.
	EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"
	// DefaultAPIKeyEnv names the variable that holds the API key.
	DefaultAPIKeyEnv = "FAKE_ENGINE_API_KEY"
)

// Knobs are the fake-only settings, given as flags or, so that a fake
// launched with a real engine's argv can still be tuned, as environment
// variables CAPYCTL_FAKE_<NAME> (flags win). RegisterKnobs binds them to a
// flag set and a Config; Resolve applies the environment after parsing.
// A flavour that parses a real engine's argv registers the knobs on a flag
// set of their own that it never parses, so they come from the environment
// only.
type Knobs struct {
	fs  *flag.FlagSet
	cfg *Config

	// ListenAll binds 0.0.0.0 instead of the requested host (for testing
	// that CapyCTL stops an engine listening off loopback).
	ListenAll bool
	// APIKeyEnv names the variable that holds the API key.
	APIKeyEnv string

	exitDuringStartup int
	names             map[string]bool
}

// RegisterKnobs defines the knob flags on fs, writing into cfg.
func RegisterKnobs(fs *flag.FlagSet, cfg *Config) *Knobs {
	k := &Knobs{fs: fs, cfg: cfg, names: map[string]bool{}}
	def := func(name string) string { k.names[name] = true; return name }
	fs.DurationVar(&cfg.StartupDelay, def("startup-delay"), cfg.StartupDelay, "stay loading this long (e.g. 2s)")
	fs.StringVar(&cfg.HoldStartupFile, def("hold-startup-file"), cfg.HoldStartupFile, "stay loading until this file exists")
	fs.IntVar(&k.exitDuringStartup, def("exit-during-startup"), -1, "log a startup failure and exit with this code instead of becoming ready (-1: off)")
	fs.Float64Var(&cfg.TokenRate, def("token-rate"), cfg.TokenRate, "tokens per second (0: no delay)")
	fs.Float64Var(&cfg.StreamTokenRate, def("stream-token-rate"), cfg.StreamTokenRate, "tokens per second of a streamed answer (0: --token-rate)")
	fs.IntVar(&cfg.Tokens, def("tokens"), orDefault(cfg.Tokens, DefaultTokens), "natural answer length in tokens")
	fs.IntVar(&cfg.MaxRunning, def("max-running"), orDefault(cfg.MaxRunning, DefaultMaxRunning), "requests generating at once; the rest wait")
	fs.IntVar(&cfg.CrashAfter, def("crash-after"), cfg.CrashAfter, "exit with code 1 after finishing this many chat requests (0: never)")
	fs.IntVar(&cfg.FailRequests, def("fail-requests"), cfg.FailRequests, "answer the next N chat requests with an engine failure (HTTP 500)")
	fs.IntVar(&cfg.StallAfterTokens, def("stall-after-tokens"), cfg.StallAfterTokens, "stop producing after N tokens, keeping the connection open (0: never)")
	fs.Var(intBytes{&cfg.BigChunkBytes}, def("big-chunk-bytes"), "send one content chunk of this many bytes first (0: off)")
	fs.BoolVar(&cfg.CloseAfterStream, def("close-after-stream"), cfg.CloseAfterStream, "close the connection after every streamed answer while advertising keep-alive (llama-server does)")
	fs.Uint64Var(&cfg.Seed, def("seed"), cfg.Seed, "seed of the deterministic answers")
	fs.BoolVar(&cfg.WakeDrift, def("wake-drift"), cfg.WakeDrift, "change the answers after every wake (a model that wakes wrongly)")
	fs.BoolVar(&cfg.LogSecret, def("log-secret"), cfg.LogSecret, "print the API key at startup (to test log redaction)")
	fs.Var(byteSize{&cfg.HostAllocBytes}, def("host-alloc"), "allocate and hold this much host memory at startup (e.g. 256MiB)")
	fs.BoolVar(&k.ListenAll, def("listen-all"), false, "bind 0.0.0.0 instead of the requested host")
	fs.StringVar(&k.APIKeyEnv, def("api-key-env"), DefaultAPIKeyEnv, "environment variable that holds the API key")
	fs.StringVar(&cfg.Sim.StatePath, def("sim-state"), cfg.Sim.StatePath, "simulated GPU state file (default $"+EnvSimState+")")
	fs.Var(byteSize{&cfg.Sim.Weights}, def("sim-weights"), "weights held on the simulated GPU (e.g. 2GiB)")
	fs.Var(byteSize{&cfg.Sim.KV}, def("sim-kv"), "KV cache held on the simulated GPU")
	fs.Var(byteSize{&cfg.Sim.StartupPeak}, def("sim-startup-peak"), "extra memory held during startup only")
	fs.Var(byteSize{&cfg.Sim.ParkResidue}, def("sim-park-residue"), "memory kept while parked")
	fs.Var(byteSize{&cfg.Sleep.WakeRate}, def("sim-wake-rate"), "bytes of weights per second a wake from sleep level 1 copies back from host RAM (0: at once)")
	fs.Var(byteSize{&cfg.Sleep.ReloadRate}, def("sim-reload-rate"), "bytes of weights per second a reload after sleep level 2 reads from disk (0: at once)")
	fs.BoolVar(&cfg.Sleep.HoldHost, def("sim-offload-host"), cfg.Sleep.HoldHost, "at sleep level 1, hold the weights' size in real host RAM until the wake (default: count it only)")
	return k
}

// EnvName is the environment variable of a knob flag.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Resolve completes the configuration after the flags were parsed: each
// knob not given as a flag is taken from its environment variable; the
// state file falls back to $CAPYCTL_SIMGPU_STATE, the device comes from
// $CUDA_VISIBLE_DEVICES, and the API key (unless already set) from the
// variable named by --api-key-env.
func (k *Knobs) Resolve(getenv func(string) string) error {
	given := map[string]bool{}
	k.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name := range k.names {
		if given[name] {
			continue
		}
		v := getenv(EnvName(name))
		if v == "" {
			continue
		}
		if err := k.fs.Set(name, v); err != nil {
			return fmt.Errorf("%s: %w", EnvName(name), err)
		}
	}
	if k.exitDuringStartup >= 0 {
		code := k.exitDuringStartup
		k.cfg.ExitDuringStartup = &code
	}
	if k.cfg.Sim.StatePath == "" {
		k.cfg.Sim.StatePath = getenv(EnvSimState)
	}
	if k.cfg.Sim.Visible == "" {
		k.cfg.Sim.Visible = getenv(EnvVisibleDevices)
	}
	if k.cfg.APIKey == "" && k.APIKeyEnv != "" {
		k.cfg.APIKey = getenv(k.APIKeyEnv)
	}
	return nil
}

// orDefault is v, or def when v is 0.
func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// byteSize is a flag.Value of a size in bytes ("512MiB").
type byteSize struct{ p *int64 }

// String implements flag.Value.
func (b byteSize) String() string {
	if b.p == nil {
		return "0"
	}
	return strconv.FormatInt(*b.p, 10)
}

// Set implements flag.Value.
func (b byteSize) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b.p = n
	return nil
}

// intBytes is byteSize for an int.
type intBytes struct{ p *int }

// String implements flag.Value.
func (b intBytes) String() string {
	if b.p == nil {
		return "0"
	}
	return strconv.Itoa(*b.p)
}

// Set implements flag.Value.
func (b intBytes) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	if n > 1<<31 {
		return fmt.Errorf("size %q is too large", s)
	}
	*b.p = int(n)
	return nil
}
